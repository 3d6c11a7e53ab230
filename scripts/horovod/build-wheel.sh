#!/usr/bin/env bash
# Builds Horovod's wheel, with Gloo and for the CPU, against the TensorFlow installed in the
# Python given, into WHEEL_DIR. Used by `make setup` and the image's builder stage; the GPU image's
# builder runs it through scripts/horovod-gpu/build-wheel.sh, which exports Horovod's GPU variables
# (HOROVOD_GPU_OPERATIONS, ...) and gives further PATCHes, applied after this directory's.
#
#   scripts/horovod/build-wheel.sh PYTHON WHEEL_DIR [PATCH...]
#
# Horovod ships only as source and compiles against one TensorFlow ABI. Its last release (0.28.1)
# does not build against TensorFlow 2.19 or newer: horovod/tensorflow/xla_mpi_ops.cc includes XLA
# headers that those wheels no longer carry. That file holds GPU code only (its body is inside
# `#if HAVE_GPU`), so the patch beside this script compiles it only in GPU builds; nothing else
# changes. The sdist is fetched from the package index, unpacked, patched and built.
set -euo pipefail

PYTHON=${1:?usage: $0 PYTHON WHEEL_DIR}
WHEEL_DIR=${2:?usage: $0 PYTHON WHEEL_DIR}
shift 2
HOROVOD_VERSION=0.28.1
HERE=$(cd "$(dirname "$0")" && pwd)

command -v cmake >/dev/null || { echo "cmake is needed to build Horovod (apt-get install cmake)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --dest "$work" "horovod==$HOROVOD_VERSION"
tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
for each in "$HERE/cpu-build-without-xla-ops.patch" "$@"; do
    patch --quiet --directory "$work/horovod-$HOROVOD_VERSION" --strip 1 < "$each"
done
HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
MAKEFLAGS=-j"$(nproc)" \
    "$PYTHON" -m pip wheel --quiet --no-build-isolation --no-deps --no-cache-dir --wheel-dir "$WHEEL_DIR" "$work/horovod-$HOROVOD_VERSION"
