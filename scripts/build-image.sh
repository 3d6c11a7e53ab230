#!/usr/bin/env bash
# Builds the project's images, targets of the one Dockerfile, and says each one's size:
#   caramel-operator:0.1.0     the operator (the chart's image), without TensorFlow or Horovod
#   caramel-runtime:0.1.0      the workers (the operator's default image for jobs: runtimeImage)
#   caramel-runtime-gpu:0.1.0  with --gpu: the GPU workers (gpuRuntimeImage), TensorFlow with CUDA
#                              and Horovod with NCCL (docs/gpu.md)
#   scripts/build-image.sh [--gpu]
# No image can be pulled on the project's machines, so by default their base is made locally
# (scripts/build-base-image.sh, skipped if it exists). Where images can be pulled, a public base
# does as well:
#   BASE_IMAGE=python:3.11-slim-bookworm scripts/build-image.sh
set -euo pipefail
cd "$(dirname "$0")/.."

OPERATOR_IMAGE="caramel-operator:0.1.0"
RUNTIME_IMAGE="caramel-runtime:0.1.0"
GPU_RUNTIME_IMAGE="caramel-runtime-gpu:0.1.0"
LOCAL_BASE_IMAGE="caramel-base:bookworm"
BASE_IMAGE="${BASE_IMAGE:-$LOCAL_BASE_IMAGE}"
case "${1:-}" in
    "") gpu="" ;;
    --gpu) gpu=1 ;;
    *) echo "usage: $0 [--gpu]" >&2; exit 2 ;;
esac

if [ "$BASE_IMAGE" = "$LOCAL_BASE_IMAGE" ]; then
    scripts/build-base-image.sh
fi

build() {  # TARGET IMAGE NOTE
    SECONDS=0
    echo "--- building $2 (target $1) on $BASE_IMAGE$3"
    docker build --build-arg BASE_IMAGE="$BASE_IMAGE" --target "$1" -t "$2" .
    echo "--- built $2 in ${SECONDS} s"
}

size() {
    local bytes
    bytes=$(docker image inspect --format '{{.Size}}' "$1")
    echo "$1: $bytes bytes ($(((bytes + 500000) / 1000000)) MB)"
}

# The operator first: the legacy builder builds every stage above a target, and the operator's
# stages come before Horovod's build, so it is ready in a minute or two even when cold.
build operator "$OPERATOR_IMAGE" ""
build runtime "$RUNTIME_IMAGE" " (a cold build compiles Horovod: 5 to 15 minutes)"
if [ -n "$gpu" ]; then
    build runtime-gpu "$GPU_RUNTIME_IMAGE" " (a cold build downloads some 4 GB of CUDA wheels and compiles Horovod with NCCL)"
fi
echo "--- image sizes"
size "$OPERATOR_IMAGE"
size "$RUNTIME_IMAGE"
if [ -n "$gpu" ]; then
    size "$GPU_RUNTIME_IMAGE"
fi
