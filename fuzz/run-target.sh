#!/usr/bin/env bash
# Runs one libFuzzer target as a Meson test.
#
# Usage: run-target.sh TARGET SEED-CORPUS WORK-DIR
#
# With CP_FUZZ_SECONDS unset or 0 it replays the seed corpus once, a quick
# regression check.  Otherwise it fuzzes for that many seconds, starting
# from the seeds; new inputs go to WORK-DIR/corpus (the seed corpus in the
# source tree is never written) and a crashing input to WORK-DIR/crash-*,
# whose path the log names.  Exit status 0 means no crash, no sanitizer
# report and no broken invariant.
#
# SPDX-License-Identifier: LGPL-2.1-or-later
set -euo pipefail

target=$1 seeds=$2 work=$3
seconds=${CP_FUZZ_SECONDS:-0}
mkdir -p "$work/corpus"

# Reports fail at once and name their frames.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export G_SLICE=always-malloc

# libFuzzer's own failure status, 77, would read as "skipped" to Meson.
common=(-error_exitcode=1 -timeout_exitcode=1 -timeout=20 -rss_limit_mb=2048
        -artifact_prefix="$work/")
if [ "$seconds" -eq 0 ]; then
  exec "$target" "${common[@]}" -runs=0 "$seeds"
fi
exec "$target" "${common[@]}" -max_total_time="$seconds" -max_len=1024 \
  -print_final_stats=1 "$work/corpus" "$seeds"
