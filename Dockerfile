# Caramel's three images, three targets of this one file:
#   operator     caramel-operator:0.1.0     the operator (python -m caramel_operator): no TensorFlow, no Horovod
#   runtime      caramel-runtime:0.1.0      the workers: TensorFlow, Keras 3 and tf-keras (Keras 2), Horovod and Caramel's runtime
#   runtime-gpu  caramel-runtime-gpu:0.1.0  the GPU workers: TensorFlow with its CUDA packages, Horovod with NCCL (docs/gpu.md)
#
#   scripts/build-image.sh [--gpu]   # here: the first two, and the GPU one on request; no image can be pulled,
#                                    # so the base is made locally with debootstrap (scripts/build-base-image.sh)
#   docker build --build-arg BASE_IMAGE=python:3.11-slim-bookworm --target operator -t caramel-operator:0.1.0 .
#   docker build --build-arg BASE_IMAGE=python:3.11-slim-bookworm --target runtime -t caramel-runtime:0.1.0 .
#
# One file rather than three: the images share the base, the pins and Caramel's wheel, built once.
# Any Debian bookworm based image works as the base: it needs Python 3.11 (bookworm's python3),
# which is installed with apt when the base has none (then apt-get clean: a base made with
# debootstrap, unlike Debian's published images, keeps the packages apt downloads). No
# BuildKit-only syntax: the legacy builder, all that Debian's docker.io has, builds it too. That
# builder builds every stage above the target, used or not, so the stages the operator needs come
# first, Horovod's build after them and the GPU image's stages last: `--target operator` compiles
# nothing, and `--target runtime` downloads no CUDA. Without --target the last stage, the GPU
# runtime, is built.

ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS base
ENV DEBIAN_FRONTEND=noninteractive
RUN if ! command -v python3 >/dev/null || ! python3 -c "import ensurepip, venv" 2>/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
        && apt-get clean && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -c "import sys; assert sys.version_info[:2] == (3, 11), 'Caramel needs Python 3.11, the base has ' + sys.version"

# Every version pin is read from pyproject.toml, the one place they are written: its dependencies
# into a pip constraints file, the names of its `operator` extra into the operator's requirements,
# what the runtime installs without dependencies (tf-keras) into a list of its own
# (scripts/image_pins.py). Only those files are copied onward, so editing other parts of
# pyproject.toml keeps the cached Horovod build.
FROM base AS pins
COPY pyproject.toml scripts/image_pins.py /tmp/
RUN python3 /tmp/image_pins.py /tmp/pyproject.toml /pins

# Caramel itself, as a wheel, so that each image holds the installed package only and no second
# copy of the source.
FROM base AS wheel
RUN python3 -m venv /opt/build && /opt/build/bin/pip install --no-cache-dir --upgrade pip
COPY pyproject.toml README.md /src/
COPY runtime /src/runtime
COPY operator /src/operator
RUN /opt/build/bin/pip wheel --no-deps --no-cache-dir --wheel-dir /wheels /src

# What both images share: the user, and a virtual environment whose `python` is the one on PATH
# (the operator runs `python -m caramel_operator`, workers `python -m caramel.launch.entrypoint ...`).
FROM base AS app
RUN useradd --uid 10001 --create-home --home-dir /home/caramel caramel
ENV VIRTUAL_ENV=/opt/caramel/venv
ENV PATH=$VIRTUAL_ENV/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN python3 -m venv $VIRTUAL_ENV && pip install --no-cache-dir --upgrade pip
COPY --from=pins /pins/constraints.txt /pins/without-dependencies.txt /opt/caramel/

# The operator's image: Caramel's wheel without its dependencies (TensorFlow and Keras among them)
# and exactly the operator's own (the `operator` extra, at the pins of the dependencies). The check
# imports the operator's entry point and its handlers, and fails if TensorFlow, Keras or Horovod
# is installed or was imported.
FROM app AS operator
COPY --from=pins /pins/operator.txt /opt/caramel/
RUN pip install --no-cache-dir -c /opt/caramel/constraints.txt -r /opt/caramel/operator.txt
COPY --from=wheel /wheels/caramel-*.whl /opt/caramel/wheels/
RUN pip install --no-cache-dir --no-deps /opt/caramel/wheels/caramel-*.whl \
    && python -c "import importlib.util, sys; import caramel_operator.__main__, caramel_operator.handlers; \
found = [name for name in ('tensorflow', 'keras', 'horovod') if name in sys.modules or importlib.util.find_spec(name)]; \
sys.exit(f'the operator image holds {found}' if found else 0)"
# A numeric UID, so that Kubernetes' runAsNonRoot can check it.
USER 10001
CMD ["python", "-m", "caramel_operator"]

# Horovod ships only as source and compiles against one TensorFlow ABI, so its wheel is built here
# against the pinned TensorFlow, with the patch that lets it build against TensorFlow 2.19+, by the
# script `make setup` runs. cmake comes from apt: the cmake 4 wheel breaks Horovod's bundled Gloo.
# python3-dev holds Debian's Python headers (public Python images carry their own, and then it is
# merely unused).
FROM base AS toolchain
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake g++ make patch python3-dev \
    && apt-get clean && rm -rf /var/lib/apt/lists/*

FROM toolchain AS builder
RUN python3 -m venv /opt/build
ENV PATH=/opt/build/bin:$PATH
COPY --from=pins /pins/constraints.txt /tmp/
RUN pip install --no-cache-dir --upgrade pip setuptools wheel \
    && pip install --no-cache-dir -c /tmp/constraints.txt tensorflow-cpu
COPY scripts/horovod /src/scripts/horovod
RUN bash /src/scripts/horovod/build-wheel.sh python3 /wheels

# What both workers' images share: tcmalloc, which the entrypoint preloads into training
# processes (spec.workers.memoryAllocator).
FROM app AS workers
RUN apt-get update && apt-get install -y --no-install-recommends libtcmalloc-minimal4 \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
# The jobs' working directory is the user's: scripts write into it (Horovod's examples their
# checkpoints, ./checkpoint-1.h5), so it belongs to the user the pods run as.
RUN install -d -o 10001 -g 10001 /app

# The workers' image.
FROM workers AS runtime
# TensorFlow and Horovod first, in their own layer: code changes do not download them again.
# tf-keras (Keras 2, for jobs whose spec.env asks for it) without its dependencies: its
# requirement on the full `tensorflow` would install a second TensorFlow.
COPY --from=builder /wheels/horovod-*.whl /opt/caramel/wheels/
RUN pip install --no-cache-dir -c /opt/caramel/constraints.txt tensorflow-cpu keras /opt/caramel/wheels/horovod-*.whl \
    && pip install --no-cache-dir --no-deps -r /opt/caramel/without-dependencies.txt
COPY --from=wheel /wheels/caramel-*.whl /opt/caramel/wheels/
RUN pip install --no-cache-dir -c /opt/caramel/constraints.txt /opt/caramel/wheels/caramel-*.whl \
    && TF_CPP_MIN_LOG_LEVEL=3 python -c "from horovod.tensorflow import mpi_ops; import caramel.tensorflow, tf_keras" \
    && python -m caramel.launch.one_tensorflow
WORKDIR /app
COPY examples examples
USER 10001
# Worker pods name their command (caramel_operator.builders). Run bare, the image shows the
# `caramel` command, with which jobs run in it as local processes (`caramel run JOB.yaml`).
CMD ["caramel", "--help"]

# The GPU image's Horovod: with NCCL for GPU tensors and Gloo for CPU ones, built against
# TensorFlow's CUDA build (`tensorflow[and-cuda]`, its CUDA packages from the package index) by
# scripts/horovod-gpu/build-wheel.sh, which explains where the rest of CUDA comes from.
FROM toolchain AS builder-gpu
RUN python3 -m venv /opt/build
ENV PATH=/opt/build/bin:$PATH
COPY --from=pins /pins/gpu.txt /pins/cuda-build.txt /tmp/
RUN pip install --no-cache-dir --upgrade pip setuptools wheel \
    && pip install --no-cache-dir -r /tmp/gpu.txt
COPY scripts/horovod /src/scripts/horovod
COPY scripts/horovod-gpu /src/scripts/horovod-gpu
RUN bash /src/scripts/horovod-gpu/build-wheel.sh python3 /wheels /tmp/cuda-build.txt

# The GPU workers' image: TensorFlow with its CUDA packages, the NCCL Horovod was built against,
# tf-keras as in the CPU image, Caramel's wheel without its dependencies (which name TensorFlow's CPU
# build). It holds no driver: the node's comes in with the container (NVIDIA's container toolkit, or
# its device plugin), which the capabilities below ask for. It sets no NVIDIA_VISIBLE_DEVICES, so a
# container given no GPU sees none. The check fails the build where TensorFlow lacks CUDA or Horovod
# NCCL.
FROM workers AS runtime-gpu
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LD_LIBRARY_PATH=/opt/caramel/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib:/opt/caramel/venv/lib/python3.11/site-packages/nvidia/nccl/lib
COPY --from=pins /pins/gpu.txt /opt/caramel/
COPY --from=builder-gpu /wheels/horovod-*.whl /opt/caramel/wheels/
RUN pip install --no-cache-dir -r /opt/caramel/gpu.txt /opt/caramel/wheels/horovod-*.whl \
    && pip install --no-cache-dir --no-deps -r /opt/caramel/without-dependencies.txt
COPY --from=wheel /wheels/caramel-*.whl /opt/caramel/wheels/
RUN pip install --no-cache-dir --no-deps /opt/caramel/wheels/caramel-*.whl \
    && TF_CPP_MIN_LOG_LEVEL=3 python -c "import tensorflow as tf; from horovod.tensorflow import mpi_ops; import caramel.tensorflow, tf_keras; \
assert tf.test.is_built_with_cuda(), 'TensorFlow is not built with CUDA'; assert mpi_ops.nccl_built(), 'Horovod is not built with NCCL'" \
    && python -m caramel.launch.one_tensorflow
WORKDIR /app
COPY examples examples
USER 10001
CMD ["caramel", "--help"]
