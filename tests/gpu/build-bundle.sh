#!/bin/sh
# build-bundle.sh: build the GPU bundle that tests/gpu/device-check.sh
# runs on a GPU machine.
#
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# Usage (from the source tree, on a machine with the build dependencies):
#
#   tests/gpu/build-bundle.sh                 # writes _build/gpu-bundle/
#
# then, on the GPU machine, with _build/gpu-bundle carried beside the
# source tree:
#
#   tests/gpu/device-check.sh _build/gpu-bundle
#
# GPU machines often have no GLib, UCX or oneDNN development files and no
# package registry to fetch them from, and a Meson build directory does
# not survive being moved (absolute paths, regeneration).  So this builds
# here what the check runs -- the CUDA tests, the GPU benchmark, the
# device-properties dump, the CPU attention tests and the cpmesh tool --
# and copies beside them every shared library they load that a GPU
# machine may lack (ldd decides: all but the C library, libstdc++ and
# libgcc_s, which newer systems have in newer, compatible versions).
# NCCL, cuDNN and NVRTC are never copied: libcpmesh opens them at run
# time, and device-check.sh points CPMESH_GPU_LIBRARY_PATH at the copies
# inside PyTorch's wheel there.  Everything goes into one xz-compressed
# tar (oneDNN alone is 40 MB unpacked), which must stay under
# BUNDLE_LIMIT_MIB (default 60: what travels to a lent GPU machine is at
# most 64 MiB in all).
#
# Environment:
#   BUILD_DIR        build directory (default: _build/gpu in the source
#                    tree; configured here for GPU_TARGETS on first use)
#   GPU_TARGETS      what nvcc compiles for (default: sm_90,compute_90:
#                    H100/H200 machine code and its PTX)
#   BUNDLE_DIR       where the bundle goes (default: _build/gpu-bundle)
#   BUNDLE_LIMIT_MIB the largest bundle accepted (default: 60)
#
# Exit status: 0 with the bundle written, 1 otherwise.

set -eu

source_dir=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=${BUILD_DIR:-$source_dir/_build/gpu}
bundle_dir=${BUNDLE_DIR:-$source_dir/_build/gpu-bundle}
gpu_targets=${GPU_TARGETS:-sm_90,compute_90}
limit_mib=${BUNDLE_LIMIT_MIB:-60}
archive=$bundle_dir/cpmesh-gpu-bundle.tar.xz

# What the check runs: build-dir path -> name in the bundle's bin/.
programs="
tests/gpu/test-cuda-runtime
tests/gpu/test-cuda-memory
tests/gpu/test-cuda-dlpack
tests/gpu/test-cuda-kernels
tests/gpu/test-cuda-layout
tests/gpu/test-index-math-cuda
tests/gpu/test-run-batch
tests/gpu/bench-cuda-layout
tests/gpu/dump-device-properties
tests/test-attention-gemm
tests/test-attention-primitives
tests/test-attention
tools/cpmesh
"

# Libraries every Linux with a newer glibc and GCC runtime has, and the
# GPU libraries found on the GPU machine itself.
system_library () {
  case $1 in
    linux-vdso.so.*|ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*) return 0 ;;
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
    libcuda.so.*|libnccl.so.*|libcudnn*.so.*|libnvrtc*.so.*) return 0 ;;
  esac
  return 1
}

fail () {
  echo "build-bundle: $*" >&2
  exit 1
}

if [ ! -f "$build_dir/build.ninja" ]; then
  echo "build-bundle: configuring $build_dir for $gpu_targets"
  meson setup "$build_dir" "$source_dir" --buildtype=debugoptimized \
    -Dcuda=enabled -Dgpu_targets="$gpu_targets" \
    -Dintrospection=disabled -Dvapi=disabled -Ddocs=disabled -Dfault_injection=false \
    > "$build_dir.setup.log" 2>&1 || { tail -n 20 "$build_dir.setup.log"; fail "meson setup failed"; }
fi
grep -q 'CP_HAS_CUDA (1)' "$build_dir/libcpmesh/cp-features.h" ||
  fail "$build_dir is a build without CUDA"

# Only what the bundle holds, not the whole test suite.
# shellcheck disable=SC2086
ninja -C "$build_dir" $programs libcpmesh/libcpmesh-1.so.0.0.0 > "$build_dir.bundle-build.log" 2>&1 ||
  { tail -n 30 "$build_dir.bundle-build.log"; fail "the build failed"; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for program in $programs; do
  cp "$build_dir/$program" "$stage/bin/"
done
cp -L "$build_dir/libcpmesh/libcpmesh-1.so.0" "$stage/lib/"

# Every library a program or a copied library needs, resolved as this
# machine resolves it, except the system's.
export LD_LIBRARY_PATH="$build_dir/libcpmesh${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for file in "$stage"/bin/* "$stage/lib/libcpmesh-1.so.0"; do
  ldd "$file" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  system_library "$name" && continue
  [ -e "$stage/lib/$name" ] || cp -L "$path" "$stage/lib/$name"
done

# Debug information stays here; symbols stay in, for backtraces and the
# sanitizer's reports.
for file in "$stage"/bin/* "$stage"/lib/*; do
  strip --strip-debug "$file"
done

# The bundle must load from itself alone (plus the system's libraries),
# and never carry or need a GPU library the GPU machine provides.
LD_LIBRARY_PATH=$stage/lib
status=0
for file in "$stage"/bin/* "$stage"/lib/*; do
  missing=$(ldd "$file" 2>&1 | grep 'not found' || true)
  [ -z "$missing" ] || { echo "build-bundle: $(basename "$file"): $missing" >&2; status=1; }
  ldd "$file" | grep -q -E 'lib(nccl|cudnn|nvrtc)' &&
    { echo "build-bundle: $(basename "$file") links a GPU library it should open at run time" >&2; status=1; }
done
[ $status -eq 0 ] || fail "the bundle does not load from itself"

{
  echo "libcpmesh GPU bundle"
  echo "source: $(git -C "$source_dir" describe --always --dirty 2> /dev/null || echo unknown)"
  echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -n 1 | awk '{ print $NF }')"
  echo "gpu targets: $gpu_targets"
  echo "files:"
  (cd "$stage" && find . -type f | sort | xargs ls -l | awk '{ printf "  %10d %s\n", $5, $9 }')
} > "$stage/MANIFEST"

mkdir -p "$bundle_dir"
rm -f "$archive"
tar -C "$stage" -cf - . | xz -T2 -6 > "$archive"
cp "$stage/MANIFEST" "$bundle_dir/MANIFEST"

unpacked=$(du -sk "$stage" | awk '{ print $1 }')
packed=$(du -k "$archive" | awk '{ print $1 }')
echo "build-bundle: $archive: $(( packed / 1024 )) MiB ($packed KiB; $(( unpacked / 1024 )) MiB unpacked, $(ls "$stage/bin" | wc -l) programs, $(ls "$stage/lib" | wc -l) libraries)"
[ "$packed" -le $(( limit_mib * 1024 )) ] || fail "the bundle is over $limit_mib MiB"
echo "build-bundle: on the GPU machine, with $(realpath --relative-to="$source_dir" "$bundle_dir") carried: tests/gpu/device-check.sh $(realpath --relative-to="$source_dir" "$bundle_dir")"
