#!/bin/sh
# check-cuda-linkage.sh LIBRARY yes|no
#
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# What a build with or without CUDA puts in the shared library.
#   no:  not one exported or imported symbol names CUDA or NCCL, and no
#        CUDA or NCCL library is NEEDED.
#   yes: the CUDA runtime is linked in statically (no libcudart NEEDED)
#        and the driver is never linked (no libcuda.so.1 NEEDED), so the
#        library loads on machines without a GPU driver; NCCL, cuDNN and
#        NVRTC are opened at run time, never NEEDED, and no runpath
#        points into the CUDA toolkit (or anywhere else outside the
#        build tree), so where they live decides nothing at load time.
set -eu

library=$1
cuda=$2
# Runpaths into the build tree (Meson's, for its own libraries) are fine.
build_root=$(cd "$(dirname "$library")/.." && pwd)
status=0

needed=$(readelf -d "$library" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
runpath=$(readelf -d "$library" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]/\2/p' | tr ':' '\n')
symbols=$(nm -D "$library" | awk '{ print $NF }')

fail () {
  echo "FAIL: $*"
  status=1
}

case $cuda in
  no)
    cuda_symbols=$(echo "$symbols" | grep -i -E 'cuda|nccl' || true)
    [ -z "$cuda_symbols" ] || fail "a build without CUDA has CUDA symbols:" "$cuda_symbols"
    cuda_libraries=$(echo "$needed" | grep -i -E 'cuda|nccl' || true)
    [ -z "$cuda_libraries" ] || fail "a build without CUDA needs" "$cuda_libraries"
    ;;
  yes)
    echo "$needed" | grep -q -x 'libcuda\.so.*' && fail "the library needs the CUDA driver (libcuda.so.1)"
    echo "$needed" | grep -q -x 'libcudart\.so.*' && fail "the library needs the shared CUDA runtime"
    echo "$symbols" | grep -q -x 'cudaGetDeviceCount' && fail "the CUDA runtime's symbols are exported"
    echo "$symbols" | grep -q -x '_cp_cuda_probe' || fail "the CUDA probe is missing"
    gpu_libraries=$(echo "$needed" | grep -E '^lib(nccl|cudnn|nvrtc)' || true)
    [ -z "$gpu_libraries" ] || fail "the library links what it should open at run time:" $gpu_libraries
    outside=$(echo "$runpath" | grep -v -e '^$' -e '^\$ORIGIN' | while read -r dir; do
      case $dir in
        "$build_root"/*) ;;
        *) echo "$dir" ;;
      esac
    done)
    [ -z "$outside" ] || fail "the library has a runpath outside the build tree:" $outside
    echo "$symbols" | grep -q -x '_cp_gpu_library_get' || fail "the GPU library loader is missing"
    ;;
  *)
    echo "usage: $0 LIBRARY yes|no" >&2
    exit 2
    ;;
esac
[ $status -eq 0 ] && echo "ok: $library, CUDA $cuda"
exit $status
