#!/usr/bin/env bash
# A short libFuzzer run for ctest: smoke.sh FUZZER SECONDS WORKDIR SEED_DIR... — starts from an empty WORKDIR (new
# inputs go there, never into the repository's seed folders) and fails on any finding, which is saved in WORKDIR/.
set -euo pipefail
fuzzer="$1" seconds="$2" work="$3"
shift 3
rm -rf "$work"
mkdir -p "$work/corpus" "$work/findings"
seeds=()
for d in "$@"; do [ -d "$d" ] && seeds+=("$d"); done
exec "$fuzzer" "$work/corpus" "${seeds[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -malloc_limit_mb=256 -artifact_prefix="$work/findings/" -print_final_stats=1
