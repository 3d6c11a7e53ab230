#!/usr/bin/env bash
# Builds Horovod's wheel with NCCL for GPU tensors and Gloo for CPU ones, against the TensorFlow with
# CUDA installed in the Python given, into WHEEL_DIR: the GPU image's builder stage runs it.
#
#   scripts/horovod-gpu/build-wheel.sh PYTHON WHEEL_DIR CUDA_BUILD_REQUIREMENTS
#
# Everything it compiles against comes from package registries:
# - NCCL: the nvidia-nccl-cu12 wheel in PYTHON (pinned in pyproject.toml, [tool.caramel] gpu-runtime),
#   linked as the shared library TensorFlow loads.
# - CUDA's runtime, headers, ptxas, NVVM and CCCL: CUDA 12.4's wheels (CUDA_BUILD_REQUIREMENTS,
#   [tool.caramel] cuda-build), installed beside the build only. CUDA 12's runtime is compatible
#   across minor versions: the one TensorFlow's wheels bring (12.5 or later) runs what 12.4 built.
# - nvcc: no CUDA 12 wheel carries the compiler driver (nvidia-cuda-nvcc-cu12 ships ptxas alone), so
#   it comes from Debian's nvidia-cuda-toolkit 12.4 (trixie, non-free), unpacked and not installed:
#   nothing of trixie replaces the image's own libraries. It compiles one file of Horovod's, its CUDA
#   kernels (fusion-buffer copies and scaling).
# They are put together into one CUDA directory, the layout nvcc and CMake look for. Then the patch
# beside this script (Horovod's TensorFlow ops find the GPU stream on TensorFlow 2.21) is applied
# and scripts/horovod/build-wheel.sh builds, with Horovod's GPU variables exported.
set -euo pipefail

PYTHON=${1:?usage: $0 PYTHON WHEEL_DIR CUDA_BUILD_REQUIREMENTS}
WHEEL_DIR=${2:?usage: $0 PYTHON WHEEL_DIR CUDA_BUILD_REQUIREMENTS}
CUDA_BUILD_REQUIREMENTS=${3:?usage: $0 PYTHON WHEEL_DIR CUDA_BUILD_REQUIREMENTS}
NVCC_PACKAGE="nvidia-cuda-toolkit=12.4.131~12.4.1-2"
NVCC_SOURCE="deb http://deb.debian.org/debian trixie non-free"
# Volta, Turing, Ampere (A100, then A10 and RTX 30), Ada and Hopper, and PTX for Hopper, which newer
# GPUs compile at load: every architecture nvcc knows would take several times as long to build.
CUDA_ARCHITECTURES=70,75,80,86,89,90
HERE=$(cd "$(dirname "$0")" && pwd)

work=$(mktemp -d)
trap 'rm -rf "$work"; rm -f /etc/apt/sources.list.d/caramel-nvcc.list' EXIT
cuda="$work/cuda"
mkdir -p "$cuda/bin" "$cuda/include" "$cuda/lib64" "$cuda/nvvm" "$work/nccl"

echo "--- nvcc from Debian's $NVCC_PACKAGE, unpacked"
echo "$NVCC_SOURCE" > /etc/apt/sources.list.d/caramel-nvcc.list
apt-get update -qq
(cd "$work" && apt-get download -qq "$NVCC_PACKAGE")
dpkg -x "$work"/nvidia-cuda-toolkit_*.deb "$work/deb"
cp -a "$work/deb/usr/lib/nvidia-cuda-toolkit/bin/"{nvcc,cicc,crt} "$work/deb/usr/bin/"{cudafe++,fatbinary,nvlink,bin2c} "$cuda/bin/"

echo "--- CUDA 12.4's wheels: $(tr '\n' ' ' < "$CUDA_BUILD_REQUIREMENTS")"
"$PYTHON" -m pip install --quiet --no-deps --no-cache-dir --target "$work/wheels" -r "$CUDA_BUILD_REQUIREMENTS"
wheels="$work/wheels/nvidia"
cp -a "$wheels/cuda_nvcc/bin/ptxas" "$cuda/bin/"
cp -a "$wheels/cuda_nvcc/nvvm/." "$cuda/nvvm/"
cp -a "$wheels/cuda_nvcc/include/." "$wheels/cuda_runtime/include/." "$wheels/cuda_cccl/include/." "$cuda/include/"
cp -a "$wheels/cuda_runtime/lib/." "$cuda/lib64/"
ln -s libcudart.so.12 "$cuda/lib64/libcudart.so"
# nvcc links the device runtime into every program by default, CMake's compiler check included;
# Horovod's kernels launch no kernels themselves, and the wheel has no such library: an empty one.
ar rc "$cuda/lib64/libcudadevrt.a"
# nvcc reads its paths from nvcc.profile beside it: this directory's, not Debian's.
cat > "$cuda/bin/nvcc.profile" <<'PROFILE'
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH            += $(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
PROFILE
"$cuda/bin/nvcc" --version | tail -1

# nvidia.nccl is a namespace package (no __init__.py) in recent wheels: its path, not its file.
nccl=$("$PYTHON" -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])")
ln -s "$nccl/lib/libnccl.so.2" "$work/nccl/libnccl.so"
echo "--- NCCL $(grep -m1 -E '^#define NCCL_VERSION_CODE' "$nccl/include/nccl.h" | awk '{print $3}') from $nccl"

export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$cuda" HOROVOD_BUILD_CUDA_CC_LIST="$CUDA_ARCHITECTURES" \
    HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$work/nccl" HOROVOD_NCCL_LINK=SHARED \
    CUDAFLAGS=--cudart=shared CMAKE_TOOLCHAIN_FILE="$HERE/cuda-runtime-shared.cmake"
bash "$HERE/../horovod/build-wheel.sh" "$PYTHON" "$WHEEL_DIR" "$HERE/tensorflow-2.21-gpu-stream.patch"
