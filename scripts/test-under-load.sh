#!/usr/bin/env bash
# The default suite on a fresh clone while every core is busy: RUNS consecutive `make test` runs, alternating
# OMP_NUM_THREADS=1 and =2, with one busy loop per core started before and stopped after (by PID).
# Usage: scripts/test-under-load.sh [RUNS]   (default 5; the clone is made from this checkout's HEAD)
set -euo pipefail
RUNS=${1:-5}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/divopd-loaded.XXXXXX)
git clone -q "$SRC" "$WORK/divopd"
cd "$WORK/divopd"
echo "clone of $(git rev-parse --short HEAD) in $WORK/divopd; $(nproc) cores"
make -s setup >"$WORK/setup.log" 2>&1
BUSY=()
stop_busy() { for pid in "${BUSY[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_busy EXIT
for _ in $(seq "$(nproc)"); do
  ( while :; do :; done ) &
  BUSY+=("$!")
done
echo "busy loops: ${BUSY[*]}"
status=0
for i in $(seq "$RUNS"); do
  threads=$(( (i % 2) ? 1 : 2 ))
  start=$(date +%s)
  if OMP_NUM_THREADS=$threads make test >"$WORK/run$i.log" 2>&1; then verdict=green; else verdict=RED; status=1; fi
  summary=$(grep -E "[0-9]+ (passed|failed)" "$WORK/run$i.log" | tail -n 1)
  echo "run $i: OMP_NUM_THREADS=$threads $verdict in $(( $(date +%s) - start )) s: ${summary:-$(tail -n 1 "$WORK/run$i.log")}"
done
exit $status
