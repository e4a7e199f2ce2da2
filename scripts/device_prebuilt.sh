#!/usr/bin/env bash
# Builds the CLI and the CUDA plugin for sm_90a here (nvcc is here, a GPU is not), strips them and packs them into
# .gpurun/pb.tar.xz (about 10 MB: the plugin's 95 MB are mostly fatbin, which xz shrinks), so that a device call
# short of time can skip the 2-minute build: carry [".deps", ".gpurun"], unpack into a folder and run its
# attnprof (it loads libattnprof_cuda.so from beside itself). The build folder is build/prebuilt-sm90a
# (incremental: a few seconds when only host code changed). Only the CLI: the GPU tests and the Python
# extension still need scripts/gpu.sh's build on the device.
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/prebuilt-sm90a
[[ -f $B/build.ninja ]] || cmake -S . -B $B -G Ninja -DATTNPROF_CUDA=ON -DATTNPROF_CUDA_ARCHITECTURES=90a \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
nice cmake --build $B --target attnprof attnprof_cuda
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp $B/attnprof $B/libattnprof_cuda.so "$stage"/
strip --strip-unneeded "$stage"/attnprof "$stage"/libattnprof_cuda.so
mkdir -p .gpurun
tar cf - -C "$stage" attnprof libattnprof_cuda.so | xz -T0 -6 >.gpurun/pb.tar.xz.tmp
mv .gpurun/pb.tar.xz.tmp .gpurun/pb.tar.xz
du -h .gpurun/pb.tar.xz
