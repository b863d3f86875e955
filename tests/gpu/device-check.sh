#!/bin/sh
# device-check.sh: run the GPU bundle's checks on this machine and print
# a summary.
#
# SPDX-License-Identifier: LGPL-2.1-or-later
#
# Usage: first, on a machine with the build dependencies,
#
#   tests/gpu/build-bundle.sh                     # writes _build/gpu-bundle/
#
# then on the GPU machine, from the source tree with _build/gpu-bundle
# carried beside it (nothing is built or installed there: GPU machines
# may reach no package registry and lack GLib's development files):
#
#   tests/gpu/device-check.sh _build/gpu-bundle
#
# It unpacks the bundle into a temporary directory and, each under a
# timeout, with the whole check bounded by CHECK_SECONDS:
#   1. records the machine (lscpu, nvidia-smi, `cpmesh info`);
#   2. runs every CUDA test (exit 77 or a TAP "# SKIP" where there is no
#      GPU) and the cpmesh demo;
#   3. dumps the device's properties (cudaGetDeviceProperties, and cuDNN's
#      serialised device descriptor) into $OUT as test data;
#   4. runs the GPU benchmark;
#   5. runs the CPU attention tests, bfloat16 included, under each oneDNN
#      instruction-set cap this CPU reaches (ONEDNN_MAX_CPU_ISA: AMX,
#      AVX-512 with bf16, AVX-512, AVX2);
#   6. runs the kernel and memory tests again under `compute-sanitizer
#      --tool memcheck` (with a GPU and compute-sanitizer only), last,
#      with the time the rest left;
# then prints a summary.  Logs go to $OUT as each step runs, so a check
# cut short still returns what it did: summary.txt, machine.txt,
# tests.log, sanitizer.log, bench.log, cpu-attention.log, and
# device-N.json / cudnn-device-N.json.
#
# NCCL, cuDNN and NVRTC are not in the bundle: CPMESH_GPU_LIBRARY_PATH is
# set to the directories holding them under GPU_LIBRARY_ROOTS (PyTorch's
# wheel), unless it is set already.
#
# Environment:
#   OUT               where the logs go (default: a new temporary directory)
#   CHECK_SECONDS     the time the whole check may take (default: 280)
#   GPU_LIBRARY_ROOTS where to look for NCCL, cuDNN and NVRTC (default:
#                     /opt/torch/.venv /usr/local/cuda/lib64)
#
# Exit status: 0 when nothing failed or timed out (skips are fine), 1
# otherwise, 2 for a missing or broken bundle.

set -u

source_dir=$(cd "$(dirname "$0")/../.." && pwd)
bundle=${1:-$source_dir/_build/gpu-bundle}
started=$(date +%s)
deadline=$(( started + ${CHECK_SECONDS:-280} ))
out=${OUT:-}
[ -n "$out" ] || out=$(mktemp -d)
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
failed=0

say () {
  echo "$*" | tee -a "$summary"
}

# A step's timeout: at most $1 seconds, and never past the deadline.
budget () {
  left=$(( deadline - $(date +%s) ))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

# run LOG LIMIT NAME COMMAND...: runs COMMAND with its output appended
# to LOG under a header, and sets $rc (124: timed out, 125: no time left).
run () {
  log=$1 limit=$(budget "$2") name=$3
  shift 3
  if [ "$limit" -le 2 ]; then
    rc=125
    return
  fi
  {
    echo "=== $name: $* (limit ${limit} s)"
  } >> "$log"
  step_started=$(date +%s)
  timeout -k 5 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  elapsed=$(( $(date +%s) - step_started ))
  echo "=== $name: exit $rc in $elapsed s" >> "$log"
}

# What a run's exit status and TAP output say, as one word and a reason.
verdict () {
  log=$1 name=$2
  case $rc in
    0)
      # This step's part of the log: from its header on.
      part=$(sed -n "/^=== $name: /,\$p" "$log")
      skipped=$(echo "$part" | grep -c '^ok [0-9]* .* # SKIP' || true)
      passed=$(echo "$part" | grep -c '^ok [0-9]*' || true)
      if [ "$skipped" -gt 0 ]; then
        why=$(echo "$part" | sed -n 's/^ok [0-9]* .* # SKIP *//p' | sort | uniq -c | sort -rn |
              head -n 1 | sed 's/^ *[0-9]* //')
        echo "passed ($(( passed - skipped )) subtests; $skipped skipped: $why)"
      elif [ "$passed" -gt 0 ]; then
        echo "passed ($passed subtests)"
      else
        echo "passed"
      fi
      ;;
    77)
      part=$(sed -n "/^=== $name: /,\$p" "$log")
      why=$(echo "$part" | grep -i -m 1 -o 'skip.*' | sed 's/^skip[a-z]*[: ]*//I')
      echo "skipped (${why:-exit 77})"
      ;;
    124|137) echo "TIMED OUT" ;;
    125) echo "NOT RUN (no time left)" ;;
    *)
      # The first failed subtest and the first message GLib aborted with.
      part=$(sed -n "/^=== $name: /,\$p" "$log")
      first=$(echo "$part" | grep -m 1 '^not ok' | sed 's/ - the subtest.*//; s/^not ok [0-9]* //')
      message=$(echo "$part" | grep -m 1 -E 'ERROR \*\*|CRITICAL \*\*|ERROR SUMMARY: [1-9]' |
                sed 's/.*\(ERROR\|CRITICAL\) \*\*: [0-9:.]* //')
      echo "FAILED (exit $rc${first:+; $first}${message:+: $message})"
      ;;
  esac
}

# Step: NAME LOG LIMIT COMMAND... -- runs it and says the verdict.
step () {
  name=$1 log=$2 limit=$3
  shift 3
  run "$log" "$limit" "$name" "$@"
  say "  $(printf '%-34s' "$name") $(verdict "$log" "$name")"
  case $rc in
    0|77) ;;
    *) failed=1 ;;
  esac
}

say "device-check: $(uname -n), $(date -u +%Y-%m-%dT%H:%M:%SZ), logs in $out"

# The bundle: unpacked where it cannot collide with anything.
archive=$bundle/cpmesh-gpu-bundle.tar.xz
if [ ! -f "$archive" ]; then
  say "bundle: $archive not found: run tests/gpu/build-bundle.sh on the build machine and carry its output"
  exit 2
fi
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
if ! tar -C "$unpacked" -xJf "$archive" 2> "$out/unpack.err" &&
   ! python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
       "$archive" "$unpacked" 2>> "$out/unpack.err"; then
  say "bundle: cannot unpack $archive: $(tail -n 1 "$out/unpack.err")"
  exit 2
fi
rm -f "$out/unpack.err"
bin=$unpacked/bin
say "bundle: $(sed -n 's/^source: //p' "$unpacked/MANIFEST"), $(sed -n 's/^gpu targets: //p' "$unpacked/MANIFEST"), $(ls "$bin" | wc -l) programs"

# As the test suite's environment (tests/meson.build), from the bundle.
export LD_LIBRARY_PATH="$unpacked/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export G_DEBUG=gc-friendly,fatal-warnings,fatal-criticals G_ENABLE_DIAGNOSTIC=1 MALLOC_CHECK_=2
export G_SLICE=always-malloc G_TEST_SRCDIR="$source_dir/tests"

# NCCL, cuDNN and NVRTC from the machine: the directories holding them.
if [ -z "${CPMESH_GPU_LIBRARY_PATH:-}" ]; then
  dirs=$(find -H ${GPU_LIBRARY_ROOTS:-/opt/torch/.venv /usr/local/cuda/lib64} \
           \( -name 'libnccl.so.2' -o -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' \) 2> /dev/null |
         xargs -r -n 1 dirname | awk '!seen[$0]++' | paste -s -d :)
  [ -n "$dirs" ] && export CPMESH_GPU_LIBRARY_PATH="$dirs"
fi
say "gpu libraries: CPMESH_GPU_LIBRARY_PATH=${CPMESH_GPU_LIBRARY_PATH:-(unset: the loader's path)}"

# 1. The machine.
machine=$out/machine.txt
{
  echo "=== uname"; uname -a
  echo "=== lscpu"; lscpu 2>&1
  echo "=== nvidia-smi"; nvidia-smi 2>&1
  echo "=== nvcc"; nvcc --version 2>&1 || /usr/local/cuda/bin/nvcc --version 2>&1
  echo "=== cpmesh info"; "$bin/cpmesh" info 2>&1
} > "$machine" 2>&1
has_gpu=no
nvidia-smi -L 2> /dev/null | grep -q '^GPU' && has_gpu=yes
if [ $has_gpu = yes ]; then
  say "gpus: $(nvidia-smi -L | paste -s -d ';')"
else
  if command -v nvidia-smi > /dev/null; then
    why=$(nvidia-smi -L 2>&1 | head -n 1)
  else
    why="no nvidia-smi"
  fi
  say "gpus: none ($why): every GPU test must skip"
fi
sed -n 's/^\(cuda [a-z]*\|nccl\|cudnn\|nvrtc\): /  &/p' "$machine" | tee -a "$summary"
flags=$(sed -n 's/^Flags: *//p' "$machine")
say "cpu: $(sed -n 's/^Model name: *//p' "$machine" | head -n 1), $(nproc) cpus; $(for f in avx512f avx512_bf16 amx_bf16; do echo "$flags" | grep -q -w $f && printf '%s ' $f; done)"

# 2. Every CUDA test, and the demo.
tests=$out/tests.log
: > "$tests"
say "cuda tests:"
for t in cuda-runtime cuda-memory cuda-dlpack; do
  step "$t" "$tests" 60 "$bin/test-$t" --tap -k
done
for t in cuda-kernels cuda-layout; do
  step "$t" "$tests" 90 "$bin/test-$t"
done
for t in index-math-cuda run-batch; do
  step "$t" "$tests" 60 "$bin/test-$t"
done
step "cpmesh demo" "$tests" 60 "$bin/cpmesh" demo

# 3. The device's properties, kept as test data.
say "device properties:"
step "dump-device-properties" "$tests" 30 "$bin/dump-device-properties" "$out"
grep '^cudnn device' "$tests" | sed 's/^/    /' | tee -a "$summary"

# 4. The GPU benchmark.
bench=$out/bench.log
: > "$bench"
say "gpu benchmarks:"
step "bench-cuda-layout" "$bench" 120 "$bin/bench-cuda-layout"
[ $rc = 0 ] && sed -n '/^=== bench-cuda-layout: .*(limit/,/^=== bench-cuda-layout: exit/p' "$bench" |
  grep -v '^===' | sed 's/^/    /' | tee -a "$summary"

# 5. CPU attention, bfloat16 included, under each cap the CPU reaches;
# a cap above what the CPU has changes nothing, so those are left out.
cpu=$out/cpu-attention.log
: > "$cpu"
caps=""
echo "$flags" | grep -q -w amx_bf16 && caps="$caps AVX512_CORE_AMX"
echo "$flags" | grep -q -w avx512_bf16 && caps="$caps AVX512_CORE_BF16"
echo "$flags" | grep -q -w avx512f && caps="$caps AVX512_CORE"
caps="$caps AVX2"
say "cpu attention (ONEDNN_MAX_CPU_ISA:$caps):"
for cap in $caps; do
  for t in attention-gemm attention-primitives attention; do
    step "$t @ $cap" "$cpu" 90 env ONEDNN_MAX_CPU_ISA=$cap "$bin/test-$t" --tap -k
  done
done

# 6. The kernel tests under compute-sanitizer, last: memcheck slows a
# program down many times over, so it gets what time the rest left.
sanitizer=$out/sanitizer.log
: > "$sanitizer"
sanitizer_bin=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2> /dev/null || true)
if [ $has_gpu = no ]; then
  say "compute-sanitizer memcheck: skipped (no GPU)"
elif [ -z "$sanitizer_bin" ]; then
  say "compute-sanitizer memcheck: skipped (compute-sanitizer not found)"
else
  say "compute-sanitizer memcheck:"
  for t in cuda-kernels cuda-layout cuda-memory cuda-dlpack; do
    step "memcheck $t" "$sanitizer" 60 "$sanitizer_bin" --tool memcheck --error-exitcode 99 "$bin/test-$t"
  done
fi

say "not covered yet: attention kernels on the GPU, NCCL collectives, page-locked host storage, comparisons with PyTorch"
say "device-check: $( [ $failed = 0 ] && echo passed || echo FAILED ) in $(( $(date +%s) - started )) s; logs: $(cd "$out" && ls | paste -s -d ' ')"
exit $failed
