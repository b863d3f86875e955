#!/bin/sh
# device-check.sh: build libcpmesh with CUDA and run its CUDA tests and
# GPU benchmarks on this machine, then print a summary.
#
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# Meant for a GPU machine (one H200 is the reference; under 8 minutes):
# it installs the Debian packages the build needs when they are missing
# (GPU machines often lack the GLib, oneDNN and UCX development files),
# configures a build with CUDA unless the build directory already holds
# one (carried build outputs are reused), builds, runs `meson test
# --suite cuda`, runs the GPU benchmarks when a GPU is present, and says
# what it skipped and why.  On a machine without a GPU it still builds
# and runs the CPU side of the CUDA suite; the GPU tests report skipped.
#
# Environment:
#   BUILD_DIR  build directory (default: build-gpu in the source tree)
#   GPU_TARGETS  what nvcc compiles for (default: sm_90, an H100/H200)
#   OUT        when set, a directory the logs are copied to
#
# Exit status: 0 when nothing failed, 1 otherwise.

set -u

source_dir=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=${BUILD_DIR:-$source_dir/build-gpu}
gpu_targets=${GPU_TARGETS:-sm_90}
deadline=$(( $(date +%s) + 450 ))
log_dir=$(mktemp -d)
summary=$log_dir/summary.txt
failed=0

say () {
  echo "$*" | tee -a "$summary"
}

# The seconds left before the whole check must end, for `timeout`.
remaining () {
  left=$(( deadline - $(date +%s) ))
  [ $left -gt 10 ] && echo $left || echo 10
}

as_root () {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo > /dev/null && sudo -n true 2> /dev/null; then
    sudo "$@"
  else
    return 1
  fi
}

# Debian packages for what the build needs and this machine lacks.
missing_packages () {
  command -v pkg-config > /dev/null || echo pkg-config
  command -v ninja > /dev/null || echo ninja-build
  command -v cc > /dev/null || echo gcc
  command -v python3 > /dev/null || echo python3
  command -v meson > /dev/null || echo meson
  pkg-config --exists glib-2.0 gio-unix-2.0 2> /dev/null || echo libglib2.0-dev
  [ -f /usr/include/oneapi/dnnl/dnnl.h ] || echo libdnnl-dev
  [ -f /usr/include/dlpack/dlpack.h ] || echo libdlpack-dev
  pkg-config --exists ucx 2> /dev/null || echo libucx-dev
}

install_packages () {
  packages=$(missing_packages | tr '\n' ' ')
  if [ -z "$packages" ]; then
    say "packages: nothing to install"
    return 0
  fi
  say "packages: installing $packages"
  if ! as_root sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages" \
       > "$log_dir/apt.log" 2>&1; then
    say "packages: could not install ($(tail -n 1 "$log_dir/apt.log")); the build may fail"
  fi
  # Meson older than 1.0 (or none from the distribution): from PyPI.
  if ! meson --version 2> /dev/null | grep -q -E '^(1|[2-9])\.'; then
    say "packages: meson >= 1.0 from PyPI"
    python3 -m pip install --quiet --user 'meson>=1.0' > "$log_dir/pip.log" 2>&1 ||
      say "packages: pip could not install meson"
    PATH=$HOME/.local/bin:$PATH
  fi
}

find_nvcc () {
  command -v nvcc > /dev/null && return 0
  for dir in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
    if [ -x "$dir/nvcc" ]; then
      PATH=$dir:$PATH
      return 0
    fi
  done
  return 1
}

gpu_present () {
  command -v nvidia-smi > /dev/null && nvidia-smi -L > "$log_dir/gpus.txt" 2>&1 && grep -q GPU "$log_dir/gpus.txt"
}

configure () {
  if [ -f "$build_dir/build.ninja" ]; then
    say "configure: reusing $build_dir"
    meson configure "$build_dir" -Dcuda=enabled > "$log_dir/configure.log" 2>&1
    return
  fi
  ucx=auto
  pkg-config --exists ucx 2> /dev/null || ucx=disabled
  # The toolkit holding the nvcc found, unless it is the usual one.
  toolkit=/usr/local/cuda
  [ -f $toolkit/include/cuda_runtime_api.h ] || toolkit=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  timeout "$(remaining)" meson setup "$build_dir" "$source_dir" --buildtype=debugoptimized \
    -Dcuda=enabled -Dgpu_targets="$gpu_targets" -Dgpu_toolkit="$toolkit" -Ducx=$ucx \
    -Dintrospection=disabled -Dvapi=disabled -Ddocs=disabled \
    > "$log_dir/configure.log" 2>&1
}

# One line per skipped test or subtest of the last run, with the reason
# it printed.
report_skips () {
  python3 - "$build_dir/meson-logs/testlog.json" << 'PY' | tee -a "$summary"
import json, re, sys
for line in open(sys.argv[1], encoding='utf-8'):
    test = json.loads(line)
    out = (test.get('stdout') or '').splitlines()
    if test.get('result') == 'SKIP':
        reason = next((l for l in out if l.startswith('SKIP')), out[-1] if out else '')
        print('  skipped %s: %s' % (test['name'], reason))
        continue
    for l in out:
        subtest = re.match(r'ok \d+ (\S+) # SKIP ?(.*)', l)
        if subtest:
            print('  skipped %s %s: %s' % (test['name'], subtest.group(1), subtest.group(2)))
PY
}

# "Ok: N" and the like from meson test's closing lines.
count_of () {
  sed -n "s/^$1: *\([0-9]*\).*/\1/p" "$2" | tail -n 1
}

started=$(date +%s)
say "device-check: $(uname -n), $(date -u +%Y-%m-%dT%H:%MZ)"

install_packages
if ! find_nvcc; then
  say "nvcc: not found; no CUDA toolkit, nothing to check"
  exit 1
fi
say "nvcc: $(nvcc --version | tail -n 2 | head -n 1)"
if gpu_present; then
  has_gpu=yes
  say "gpus: $(tr '\n' ';' < "$log_dir/gpus.txt")"
else
  has_gpu=no
  say "gpus: none ($(head -n 1 "$log_dir/gpus.txt" 2> /dev/null || echo 'no nvidia-smi')): the GPU tests skip and the GPU benchmarks are not run"
fi

if ! configure; then
  say "configure: FAILED (tail of the log follows)"
  tail -n 20 "$log_dir/configure.log"
  exit 1
fi
build_started=$(date +%s)
if ! timeout "$(remaining)" ninja -C "$build_dir" > "$log_dir/build.log" 2>&1; then
  say "build: FAILED (tail of the log follows)"
  tail -n 30 "$log_dir/build.log"
  exit 1
fi
say "build: ok in $(( $(date +%s) - build_started )) s"

timeout "$(remaining)" meson test -C "$build_dir" --no-rebuild --suite cuda --print-errorlogs \
  > "$log_dir/tests.log" 2>&1
grep -E '^ *[0-9]+/[0-9]+ ' "$log_dir/tests.log"
ok=$(count_of Ok "$log_dir/tests.log")
fail=$(count_of Fail "$log_dir/tests.log")
skipped=$(count_of Skipped "$log_dir/tests.log")
timed_out=$(count_of Timeout "$log_dir/tests.log")
say "tests (suite cuda): ${ok:-?} ok, ${fail:-?} failed, ${timed_out:-?} timed out, ${skipped:-?} skipped"
[ "${fail:-1}" = 0 ] && [ "${timed_out:-1}" = 0 ] || failed=1
report_skips

if [ $has_gpu = yes ]; then
  if timeout "$(remaining)" meson test -C "$build_dir" --no-rebuild --benchmark --suite gpu --verbose \
       > "$log_dir/bench.log" 2>&1; then
    say "benchmarks (suite gpu):"
    grep -v -E '^(=|-|$)|meson-logs|^Ok:|^Expected|^Fail|^Unexpected|^Skipped|^Timeout' "$log_dir/bench.log" |
      tee -a "$summary"
  else
    say "benchmarks: FAILED"
    tail -n 30 "$log_dir/bench.log"
    failed=1
  fi
else
  say "benchmarks: skipped (no GPU)"
fi
say "not covered yet: attention kernels, NCCL, page-locked host storage, and the comparisons with PyTorch"
say "device-check: $( [ $failed = 0 ] && echo passed || echo FAILED ) in $(( $(date +%s) - started )) s"

if [ -n "${OUT:-}" ]; then
  cp "$log_dir"/*.log "$log_dir"/*.txt "$OUT"/ 2> /dev/null
fi
exit $failed
