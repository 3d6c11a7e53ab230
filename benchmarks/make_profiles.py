"""Write benchmarks/profiles/{resnet50,vgg16,bert_base}.json: the emulated accelerator's workload.

    python benchmarks/make_profiles.py

Each profile lists the model's trainable parameter tensors in forward order with their true
shapes, and per tensor the forward time of the work attributed to it on the emulated device:
forward_seconds = FLOPs x batch / device rate, backward_seconds = 2 x forward_seconds (the
backward pass computes the gradients of both the input and the weights).

FLOPs per example (a multiply-add counts 2):
- convolution / dense kernels: 2 x kernel fan-in x output elements (from the layer's output size);
- their biases: 1 per output element;
- BatchNormalization: gamma 3 per output element (batch statistics, normalise, scale), beta 1
  (shift); LayerNorm the same per normalised element;
- embeddings: 1 per output element (the sum of the three embeddings);
- BERT's attention core (scores Q.K^T, softmax, weighted sum of V) has no parameter of its own;
  it runs just before the attention output projection and is attributed to that kernel;
- the other parameter-free layers (ReLU, pooling, residual adds, padding) are under 1% of the
  FLOPs and not counted.

ResNet-50 and VGG-16 come from tf.keras.applications (weights=None: no download) at 224x224
with 1000 classes, in the order of model.layers, a topological order of the graph. BERT-base
(uncased: vocabulary 30522, hidden 768, 12 layers, 12 heads, FFN 3072, 512 positions) is
built by hand for sequences of 128 tokens, without the pre-training heads.

The device: DEVICE_TFLOPS sustained, see DEVICE below.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # as every Caramel worker runs

from benchmarks.profiles import NAMES, PROFILE_DIRECTORY

DEVICE_TFLOPS = 1.25
DEVICE = (
    "1.25 TFLOP/s sustained: ResNet-50 training at about 53 images/s (3 x 7.8 GFLOP per image), "
    "what one GPU of an NVIDIA K80 board sustains in FP32 (about 50 images/s). Only the ratio of "
    "compute to communication matters for overlap: this device on 1 to 4 Gbit/s links stands for a "
    "V100 in FP32, about 7 times faster (about 390 ResNet-50 images/s), on 7 to 28 Gbit/s links, at link speeds that 4 workers on this 2-core machine can sustain (Gloo tops out near 3 Gbit/s here)."
)
BATCH_SIZE = 32
IMAGE_SIZE = 224
BERT_SEQUENCE = 128
BN_SCALE_FLOPS, BN_SHIFT_FLOPS = 3, 1


@dataclass
class Tensor:
    name: str
    shape: list[int]
    flops: float  # forward FLOPs per example attributed to this tensor


def keras_tensors(model) -> list[Tensor]:
    """The trainable tensors of a Keras convnet, with the FLOPs of the layer output they produce."""
    tensors = []
    for layer in model.layers:
        if not layer.trainable_weights:
            continue
        output_elements = _elements(layer.output.shape)
        kind = type(layer).__name__
        for weight in layer.trainable_weights:
            role = weight.name.split("/")[-1].split(":")[0]
            shape = [int(d) for d in weight.shape]
            tensors.append(Tensor(weight.name.split(":")[0], shape, _keras_flops(kind, role, shape, output_elements)))
    return tensors


def _elements(shape) -> int:
    count = 1
    for dimension in shape[1:]:  # without the batch dimension
        count *= int(dimension)
    return count


def _keras_flops(kind: str, role: str, shape: list[int], output_elements: int) -> float:
    if kind in ("Conv2D", "Dense") and role == "kernel":
        fan_in = 1
        for dimension in shape[:-1]:
            fan_in *= dimension
        return 2.0 * fan_in * output_elements
    if kind in ("Conv2D", "Dense") and role == "bias":
        return float(output_elements)
    if kind == "BatchNormalization":
        return float({"gamma": BN_SCALE_FLOPS, "beta": BN_SHIFT_FLOPS}[role] * output_elements)
    raise ValueError(f"no FLOP rule for {role} of a {kind} layer")


def bert_base_tensors(sequence: int = BERT_SEQUENCE) -> list[Tensor]:
    """BERT-base's parameter tensors in forward order, with FLOPs per sequence of `sequence` tokens."""
    hidden, ffn, layers, vocabulary, positions, segments = 768, 3072, 12, 30522, 512, 2
    tensors = [
        Tensor("embeddings/word_embeddings", [vocabulary, hidden], sequence * hidden),
        Tensor("embeddings/position_embeddings", [positions, hidden], sequence * hidden),
        Tensor("embeddings/token_type_embeddings", [segments, hidden], sequence * hidden),
        *_layer_norm("embeddings/LayerNorm", sequence, hidden),
    ]
    # Scores Q.K^T and the weighted sum of V (2 x tokens^2 x hidden each), softmax ~5 per score.
    attention_core = 4.0 * sequence * sequence * hidden + 5.0 * 12 * sequence * sequence
    for index in range(layers):
        prefix = f"encoder/layer_{index}"
        for projection in ("query", "key", "value"):
            tensors += _dense(f"{prefix}/attention/self/{projection}", hidden, hidden, sequence)
        output = _dense(f"{prefix}/attention/output/dense", hidden, hidden, sequence)
        output[0].flops += attention_core
        tensors += output
        tensors += _layer_norm(f"{prefix}/attention/output/LayerNorm", sequence, hidden)
        tensors += _dense(f"{prefix}/intermediate/dense", hidden, ffn, sequence)
        tensors += _dense(f"{prefix}/output/dense", ffn, hidden, sequence)
        tensors += _layer_norm(f"{prefix}/output/LayerNorm", sequence, hidden)
    # The pooler reads the first ([CLS]) token only.
    return tensors + _dense("pooler/dense", hidden, hidden, 1)


def _dense(name: str, inputs: int, outputs: int, rows: int) -> list[Tensor]:
    return [
        Tensor(f"{name}/kernel", [inputs, outputs], 2.0 * inputs * outputs * rows),
        Tensor(f"{name}/bias", [outputs], float(outputs * rows)),
    ]


def _layer_norm(name: str, rows: int, width: int) -> list[Tensor]:
    return [
        Tensor(f"{name}/gamma", [width], float(BN_SCALE_FLOPS * rows * width)),
        Tensor(f"{name}/beta", [width], float(BN_SHIFT_FLOPS * rows * width)),
    ]


def profile_document(name: str, tensors: list[Tensor], example: str) -> dict:
    seconds_per_flop = BATCH_SIZE / (DEVICE_TFLOPS * 1e12)
    return {
        "name": name,
        "batch_size": BATCH_SIZE,
        "example": example,
        "device_tflops": DEVICE_TFLOPS,
        "device": DEVICE,
        "parameters": sum(_count(t.shape) for t in tensors),
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


def _count(shape: list[int]) -> int:
    count = 1
    for dimension in shape:
        count *= dimension
    return count


def build_all() -> dict[str, dict]:
    import tensorflow as tf

    image = f"{IMAGE_SIZE}x{IMAGE_SIZE}x3 image, 1000 classes"
    shape = (IMAGE_SIZE, IMAGE_SIZE, 3)
    return {
        "resnet50": profile_document(
            "resnet50", keras_tensors(tf.keras.applications.ResNet50(weights=None, input_shape=shape)), image
        ),
        "vgg16": profile_document(
            "vgg16", keras_tensors(tf.keras.applications.VGG16(weights=None, input_shape=shape)), image
        ),
        "bert_base": profile_document("bert_base", bert_base_tensors(), f"sequence of {BERT_SEQUENCE} tokens"),
    }


def main() -> None:
    PROFILE_DIRECTORY.mkdir(exist_ok=True)
    documents = build_all()
    assert tuple(documents) == NAMES
    for name, document in documents.items():
        path = PROFILE_DIRECTORY / f"{name}.json"
        path.write_text(json.dumps(document, indent=1) + "\n")
        forward = sum(t["forward_seconds"] for t in document["tensors"])
        print(
            f"{name:10} {document['parameters'] / 1e6:7.2f} M parameters in {len(document['tensors']):3} tensors "
            f"({document['parameters'] * 4 / 1e6:.0f} MB of gradients), "
            f"{document['forward_flops_per_example'] / 1e9:5.1f} GFLOP forward per example, "
            f"step compute {3 * forward:.3f} s at batch {BATCH_SIZE} and {DEVICE_TFLOPS} TFLOP/s -> {path.name}"
        )


if __name__ == "__main__":
    main()
