# Read by CMake as its toolchain file (CMAKE_TOOLCHAIN_FILE, from scripts/horovod-gpu/build-wheel.sh)
# before Horovod's CMakeLists defaults the CUDA runtime to the static library, which CUDA 12.4's
# wheel does not ship: Horovod links the shared one, which TensorFlow loads too.
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
