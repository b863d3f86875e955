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
#        library loads on machines without a GPU driver.
set -eu

library=$1
cuda=$2
status=0

needed=$(readelf -d "$library" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
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
    ;;
  *)
    echo "usage: $0 LIBRARY yes|no" >&2
    exit 2
    ;;
esac
[ $status -eq 0 ] && echo "ok: $library, CUDA $cuda"
exit $status
