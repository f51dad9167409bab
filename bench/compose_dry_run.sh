#!/usr/bin/env bash
# Runs `ployz deploy --dry-run` on every project of the Compose corpus (compose/tests/corpus/),
# from its own folder with its `files` and `profiles` lists, against a running daemon, and says
# how many plan; then times the dry run of the largest project (median of RUNS runs, process
# start to plan printed).
#
#   PLOYZ_CONNECT=unix:///path/to/ployz.sock bash bench/compose_dry_run.sh
#
# The daemon may be the demo's (`scripts/demo.sh`, which prints its socket). PLOYZ defaults to
# the release binary; RUNS to 21.
set -euo pipefail
cd "$(dirname "$0")/.."
PLOYZ="${PLOYZ:-$PWD/target/release/ployz}"
RUNS="${RUNS:-21}"
: "${PLOYZ_CONNECT:?set PLOYZ_CONNECT to the socket of the daemon, e.g. unix://\$PWD/demo-data/ployz.sock}"
export PLOYZ_CONNECT

args_of() { # the -f and -p arguments of a corpus project
  local d=$1 line
  if [ -f "$d/files" ]; then while read -r line; do [ -n "$line" ] && printf -- '-f\n%s\n' "$line"; done <"$d/files"; fi
  if [ -f "$d/profiles" ]; then while read -r line; do [ -n "$line" ] && printf -- '-p\n%s\n' "$line"; done <"$d/profiles"; fi
  return 0
}

planned=0 refused=0 largest="" largest_bytes=0
for d in compose/tests/corpus/*/; do
  mapfile -t args < <(args_of "$d")
  if out=$(cd "$d" && "$PLOYZ" deploy --dry-run "${args[@]}" 2>&1 >/dev/null); then
    planned=$((planned + 1))
  else
    refused=$((refused + 1))
    echo "refused: $d"; grep '^error:' <<<"$out" || true
  fi
  bytes=$(find "$d" -maxdepth 2 -name '*.y*ml' -exec cat {} + | wc -c)
  if [ "$bytes" -gt "$largest_bytes" ]; then largest=$d largest_bytes=$bytes; fi
done
echo "corpus: $planned planned, $refused refused"

mapfile -t args < <(args_of "$largest")
times=()
for _ in $(seq 1 "$RUNS"); do
  start=$(date +%s%N)
  (cd "$largest" && "$PLOYZ" deploy --dry-run "${args[@]}" >/dev/null 2>&1) || true
  times+=($((($(date +%s%N) - start) / 1000)))
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
median=$(sed -n "$(((RUNS + 1) / 2))p" <<<"$sorted")
min=$(head -1 <<<"$sorted")
echo "largest: $largest ($largest_bytes bytes): dry run median $((median / 1000)).$(((median % 1000) / 100)) ms, best $((min / 1000)).$(((min % 1000) / 100)) ms over $RUNS runs"
