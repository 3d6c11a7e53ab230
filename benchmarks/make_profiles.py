"""Write benchmarks/profiles/NAME.json for every model of the zoo: the emulated accelerator's workloads.

    python -m benchmarks.make_profiles                 # every profile
    python -m benchmarks.make_profiles densenet121     # some

Each profile lists the model's trainable parameter tensors in forward order with their true
shapes, and per tensor the forward time of the work attributed to it on the emulated device:
forward_seconds = FLOPs x batch / device rate, backward_seconds = 2 x forward_seconds (the
backward pass computes the gradients of both the input and the weights).

FLOPs per example (a multiply-add counts 2):
- convolution and dense kernels: 2 x kernel fan-in x output elements (from the layer's output
  size; a grouped convolution's kernel holds only its group's inputs, so the same rule holds);
- depthwise kernels: 2 x kernel height x width per output element; a separable convolution's
  depthwise kernel per element of its intermediate (input-channel) output, its pointwise kernel
  as a 1x1 convolution;
- biases: 1 per output element;
- BatchNormalization and LayerNormalization: gamma 3 per output element (statistics,
  normalise, scale), beta 1 (shift); a LayerScale's gamma 1;
- embeddings: 1 per output element;
- attention cores (scores Q.K^T, softmax, weighted sum of V) have no parameter of their own;
  each runs just before its attention output projection and is attributed to that kernel;
- the other parameter-free layers (activations, pooling, residual adds, padding) are under a
  few per cent of the FLOPs and not counted.

The convnets come from tf.keras.applications (weights=None: no download) at 224x224 with 1000
classes, in the order of model.layers (a topological order of the graph; nested models are
walked in place). The transformers are built by hand, for sequences of 128 tokens:
- BERT-base (uncased: vocabulary 30522, hidden 768, 12 layers, FFN 3072, 512 positions),
  without the pre-training heads;
- GPT-2 small (vocabulary 50257, 1024 positions, hidden 768, 12 layers): its token embedding is
  also its output layer (tied weights), so that one 154 MB gradient is complete only when
  backpropagation reaches the lookup, last; the output layer's compute is attributed to the
  final LayerNorm, whose place in the forward pass it shares;
- T5-small (vocabulary 32128, d_model 512, 6 + 6 layers, 8 heads, FFN 2048, no biases, RMS
  norms): one embedding shared by the encoder's input, the decoder's input and the output
  layer, read first and released last;
- ViT-B/16 (224x224 images, 16x16 patches: 197 tokens, hidden 768, 12 layers, MLP 3072).

The device: DEVICE_TFLOPS sustained, see DEVICE below. The benchmark scales it per link rate
to each profile's operating point (benchmarks/zoo.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.profiles import NAMES, PROFILE_DIRECTORY

DEVICE_TFLOPS = 1.25
DEVICE = (
    "1.25 TFLOP/s sustained: ResNet-50 training at about 53 images/s (3 x 7.8 GFLOP per image), "
    "what one GPU of an NVIDIA K80 board sustains in FP32 (about 50 images/s). Only the ratio of "
    "compute to communication matters for overlap: this device on 1 to 4 Gbit/s links stands for a "
    "device 8 times faster (a V100 in FP32 trains ResNet-50 at about 390 images/s) on 8 to 32 Gbit/s "
    "links, at link speeds that 4 workers on this 2-core machine can sustain (Gloo tops out near 3 Gbit/s here)."
)
BATCH_SIZE = 32
IMAGE_SIZE = 224
SEQUENCE = 128
NORM_SCALE_FLOPS, NORM_SHIFT_FLOPS = 3, 1
IMAGE = f"{IMAGE_SIZE}x{IMAGE_SIZE}x3 image, 1000 classes"
TOKENS = f"sequence of {SEQUENCE} tokens"


@dataclass
class Tensor:
    name: str
    shape: list[int]
    flops: float  # forward FLOPs per example attributed to this tensor


def keras2_role(kind: str, role: str) -> str:
    """A weight's role as Keras 2 named it, where Keras 3 names it otherwise: a depthwise
    convolution's kernel, and ConvNeXt's layer scale (unnamed in Keras 3: "variable", "variable_1")."""
    if kind == "DepthwiseConv2D" and role == "kernel":
        return "depthwise_kernel"
    if kind == "LayerScale" and role.startswith("variable"):
        return "gamma"
    return role


def keras_tensors(model) -> list[Tensor]:
    """The trainable tensors of a Keras convnet, with the FLOPs of the layer output they produce."""
    tensors = []
    for layer in _layers(model):
        for weight in layer.trainable_weights:
            # Keras 3 names a weight by its role ("kernel"); the profiles keep Keras 2's names,
            # the layer's and the role ("conv1_conv/kernel").
            role = keras2_role(type(layer).__name__, weight.name.split("/")[-1].split(":")[0])
            name = f"{layer.name}/{role}"
            shape = [int(d) for d in weight.shape]
            tensors.append(Tensor(name, shape, _keras_flops(layer, role, shape)))
    return tensors


def _layers(model) -> list:
    """The layers that own trainable weights, in order, walking nested models in place."""
    found = []
    for layer in model.layers:
        if getattr(layer, "layers", None):
            found += _layers(layer)
        elif layer.trainable_weights:
            found.append(layer)
    return found


def _product(values) -> int:
    count = 1
    for value in values:
        count *= int(value)
    return count


def _keras_flops(layer, role: str, shape: list[int]) -> float:
    kind = type(layer).__name__
    outputs = _product(layer.output.shape[1:])  # per example: without the batch dimension
    if kind in ("Conv2D", "Dense") and role == "kernel":
        return 2.0 * _product(shape[:-1]) * outputs
    if kind == "DepthwiseConv2D" and role == "depthwise_kernel":
        return 2.0 * _product(shape[:2]) * outputs
    if kind == "SeparableConv2D" and role == "depthwise_kernel":
        pixels = outputs // layer.filters  # the same before and after the pointwise step
        return 2.0 * _product(shape[:3]) * pixels
    if kind == "SeparableConv2D" and role == "pointwise_kernel":
        return 2.0 * shape[2] * outputs
    if kind in ("Conv2D", "Dense", "DepthwiseConv2D", "SeparableConv2D") and role == "bias":
        return float(outputs)
    if kind in ("BatchNormalization", "LayerNormalization") and role in ("gamma", "beta"):
        return float((NORM_SCALE_FLOPS if role == "gamma" else NORM_SHIFT_FLOPS) * outputs)
    if kind == "LayerScale" and role == "gamma":
        return float(outputs)
    raise ValueError(f"no FLOP rule for {role} of a {kind} layer ({layer.name})")


# -- transformers, by hand --------------------------------------------------------------------


def _dense(name: str, inputs: int, outputs: int, rows: int, bias: bool = True) -> list[Tensor]:
    kernel = [Tensor(f"{name}/kernel", [inputs, outputs], 2.0 * inputs * outputs * rows)]
    return kernel + ([Tensor(f"{name}/bias", [outputs], float(outputs * rows))] if bias else [])


def _layer_norm(name: str, rows: int, width: int, shift: bool = True) -> list[Tensor]:
    gamma = [Tensor(f"{name}/gamma", [width], float(NORM_SCALE_FLOPS * rows * width))]
    return gamma + ([Tensor(f"{name}/beta", [width], float(NORM_SHIFT_FLOPS * rows * width))] if shift else [])


def _attention_core(rows: int, keys: int, width: int, heads: int) -> float:
    """Scores Q.K^T and the weighted sum of V (2 x rows x keys x width each), softmax ~5 per score."""
    return 4.0 * rows * keys * width + 5.0 * heads * rows * keys


def _encoder_block(prefix: str, rows: int, hidden: int, ffn: int, heads: int, names: tuple[str, ...], pre_norm: bool) -> list[Tensor]:
    """One transformer block with biases and LayerNorms: self-attention (query, key, value,
    output projections), then a two-layer MLP; `names` are the block's parts as the model
    names them (query, key, value, attention output, first norm, MLP in, MLP out, second norm),
    one name for query, key and value where one projection makes all three."""
    query, key, value, output, norm_1, mlp_in, mlp_out, norm_2 = names
    attention = []
    if query == key == value:  # one projection makes all three (GPT-2's c_attn)
        attention += _dense(f"{prefix}/{query}", hidden, 3 * hidden, rows)
    else:
        for projection in (query, key, value):
            attention += _dense(f"{prefix}/{projection}", hidden, hidden, rows)
    projected = _dense(f"{prefix}/{output}", hidden, hidden, rows)
    projected[0].flops += _attention_core(rows, rows, hidden, heads)
    attention += projected
    mlp = _dense(f"{prefix}/{mlp_in}", hidden, ffn, rows) + _dense(f"{prefix}/{mlp_out}", ffn, hidden, rows)
    first, second = _layer_norm(f"{prefix}/{norm_1}", rows, hidden), _layer_norm(f"{prefix}/{norm_2}", rows, hidden)
    return (first + attention + second + mlp) if pre_norm else (attention + first + mlp + second)


BERT_BLOCK = ("attention/self/query", "attention/self/key", "attention/self/value", "attention/output/dense",
              "attention/output/LayerNorm", "intermediate/dense", "output/dense", "output/LayerNorm")  # fmt: skip
GPT2_BLOCK = ("attn/c_attn", "attn/c_attn", "attn/c_attn", "attn/c_proj", "ln_1", "mlp/c_fc", "mlp/c_proj", "ln_2")
VIT_BLOCK = ("attention/query", "attention/key", "attention/value", "attention/output", "layernorm_before",
             "mlp/dense_1", "mlp/dense_2", "layernorm_after")  # fmt: skip


def bert_base_tensors(sequence: int = SEQUENCE) -> list[Tensor]:
    """BERT-base's parameter tensors in forward order, with FLOPs per sequence of `sequence` tokens."""
    hidden, ffn, layers, heads, vocabulary, positions, segments = 768, 3072, 12, 12, 30522, 512, 2
    tensors = [
        Tensor("embeddings/word_embeddings", [vocabulary, hidden], sequence * hidden),
        Tensor("embeddings/position_embeddings", [positions, hidden], sequence * hidden),
        Tensor("embeddings/token_type_embeddings", [segments, hidden], sequence * hidden),
        *_layer_norm("embeddings/LayerNorm", sequence, hidden),
    ]
    for index in range(layers):
        tensors += _encoder_block(f"encoder/layer_{index}", sequence, hidden, ffn, heads, BERT_BLOCK, pre_norm=False)
    # The pooler reads the first ([CLS]) token only.
    return tensors + _dense("pooler/dense", hidden, hidden, 1)


def gpt2_small_tensors(sequence: int = SEQUENCE) -> list[Tensor]:
    """GPT-2 small (124 M parameters), its token embedding tied to its output layer."""
    hidden, layers, heads, vocabulary, positions = 768, 12, 12, 50257, 1024
    tensors = [Tensor("wte", [vocabulary, hidden], sequence * hidden), Tensor("wpe", [positions, hidden], sequence * hidden)]
    for index in range(layers):
        tensors += _encoder_block(f"h_{index}", sequence, hidden, 4 * hidden, heads, GPT2_BLOCK, pre_norm=True)
    final = _layer_norm("ln_f", sequence, hidden)
    final[-1].flops += 2.0 * hidden * vocabulary * sequence  # the tied output layer
    return tensors + final


def t5_small_tensors(sequence: int = SEQUENCE) -> list[Tensor]:
    """T5-small (60.5 M parameters): one embedding shared by both stacks' inputs and the output
    layer; no biases; RMS norms (a scale only); a relative position bias in each stack's first
    self-attention."""
    hidden, ffn, layers, heads, vocabulary, buckets = 512, 2048, 6, 8, 32128, 32

    def attention(prefix: str, keys: int) -> list[Tensor]:
        parts = [_dense(f"{prefix}/{p}", hidden, hidden, sequence, bias=False)[0] for p in ("q", "k", "v", "o")]
        parts[-1].flops += _attention_core(sequence, keys, hidden, heads)
        return parts

    def feed_forward(prefix: str) -> list[Tensor]:
        return _dense(f"{prefix}/wi", hidden, ffn, sequence, bias=False) + _dense(f"{prefix}/wo", ffn, hidden, sequence, bias=False)

    def norm(name: str) -> list[Tensor]:
        return _layer_norm(name, sequence, hidden, shift=False)

    tensors = [Tensor("shared", [vocabulary, hidden], 2.0 * sequence * hidden)]  # both inputs' lookups
    for stack in ("encoder", "decoder"):
        tensors.append(Tensor(f"{stack}/block_0/relative_attention_bias", [buckets, heads], float(heads * sequence * sequence)))
        for index in range(layers):
            prefix = f"{stack}/block_{index}"
            tensors += norm(f"{prefix}/self_attention/layer_norm") + attention(f"{prefix}/self_attention", sequence)
            if stack == "decoder":
                tensors += norm(f"{prefix}/cross_attention/layer_norm") + attention(f"{prefix}/cross_attention", sequence)
            tensors += norm(f"{prefix}/ffn/layer_norm") + feed_forward(f"{prefix}/ffn")
        tensors += norm(f"{stack}/final_layer_norm")
    tensors[-1].flops += 2.0 * hidden * vocabulary * sequence  # the tied output layer
    return tensors


def vit_b16_tensors() -> list[Tensor]:
    """ViT-B/16 at 224x224: a 16x16 patch embedding (a convolution), a class token, position
    embeddings, 12 pre-norm blocks and a 1000-class head on the class token."""
    hidden, layers, heads, patch, classes = 768, 12, 12, 16, 1000
    patches = (IMAGE_SIZE // patch) ** 2
    tokens = patches + 1
    tensors = [
        *_conv("embeddings/patch_embeddings", patch, 3, hidden, patches),
        Tensor("embeddings/cls_token", [1, 1, hidden], float(hidden)),
        Tensor("embeddings/position_embeddings", [1, tokens, hidden], float(tokens * hidden)),
    ]
    for index in range(layers):
        tensors += _encoder_block(f"encoder/layer_{index}", tokens, hidden, 4 * hidden, heads, VIT_BLOCK, pre_norm=True)
    return tensors + _layer_norm("layernorm", tokens, hidden) + _dense("classifier", hidden, classes, 1)


def _conv(name: str, kernel: int, inputs: int, outputs: int, pixels: int) -> list[Tensor]:
    return [
        Tensor(f"{name}/kernel", [kernel, kernel, inputs, outputs], 2.0 * kernel * kernel * inputs * outputs * pixels),
        Tensor(f"{name}/bias", [outputs], float(outputs * pixels)),
    ]


# -- the profiles -----------------------------------------------------------------------------


def profile_document(name: str, tensors: list[Tensor], example: str) -> dict:
    seconds_per_flop = BATCH_SIZE / (DEVICE_TFLOPS * 1e12)
    return {
        "name": name,
        "batch_size": BATCH_SIZE,
        "example": example,
        "device_tflops": DEVICE_TFLOPS,
        "device": DEVICE,
        "parameters": sum(_product(t.shape) for t in tensors),
        "forward_flops_per_example": sum(t.flops for t in tensors),
        "tensors": [
            {
                "name": t.name,
                "shape": t.shape,
                "forward_seconds": t.flops * seconds_per_flop,
                "backward_seconds": 2 * t.flops * seconds_per_flop,
            }
            for t in tensors
        ],
    }


def _application(name: str) -> Callable[[], tuple[list[Tensor], str]]:
    def build() -> tuple[list[Tensor], str]:
        import tensorflow as tf

        model = getattr(tf.keras.applications, name)(weights=None, input_shape=(IMAGE_SIZE, IMAGE_SIZE, 3))
        return keras_tensors(model), IMAGE

    return build


BUILDERS: dict[str, Callable[[], tuple[list[Tensor], str]]] = {
    "resnet50": _application("ResNet50"),
    "vgg16": _application("VGG16"),
    "bert_base": lambda: (bert_base_tensors(), TOKENS),
    "densenet121": _application("DenseNet121"),
    "mobilenet_v2": _application("MobileNetV2"),
    "mobilenet_v3_large": _application("MobileNetV3Large"),
    "efficientnet_b0": _application("EfficientNetB0"),
    "nasnet_mobile": _application("NASNetMobile"),
    "inception_v3": _application("InceptionV3"),
    "xception": _application("Xception"),
    "resnet152_v2": _application("ResNet152V2"),
    "convnext_tiny": _application("ConvNeXtTiny"),
    "vgg19": _application("VGG19"),
    "gpt2_small": lambda: (gpt2_small_tensors(), TOKENS),
    "t5_small": lambda: (t5_small_tensors(), f"{TOKENS} in, {SEQUENCE} out"),
    "vit_b16": lambda: (vit_b16_tensors(), IMAGE),
}


def main(names: list[str]) -> None:
    assert set(BUILDERS) == set(NAMES), "benchmarks/profiles.py NAMES and BUILDERS disagree"
    unknown = [name for name in names if name not in BUILDERS]
    if unknown:
        sys.exit(f"make_profiles: unknown profile {', '.join(unknown)} (known: {', '.join(NAMES)})")
    PROFILE_DIRECTORY.mkdir(exist_ok=True)
    for name in names or NAMES:
        tensors, example = BUILDERS[name]()
        document = profile_document(name, tensors, example)
        path = PROFILE_DIRECTORY / f"{name}.json"
        path.write_text(json.dumps(document, indent=1) + "\n")
        forward = sum(t["forward_seconds"] for t in document["tensors"])
        print(
            f"{name:18} {document['parameters'] / 1e6:7.2f} M parameters in {len(document['tensors']):3} tensors "
            f"({document['parameters'] * 4 / 1e6:5.0f} MB of gradients), "
            f"{document['forward_flops_per_example'] / 1e9:5.1f} GFLOP forward per example, "
            f"step compute {3 * forward:.3f} s at batch {BATCH_SIZE} and {DEVICE_TFLOPS} TFLOP/s -> {path.name}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
