#!/usr/bin/env bash
# The installable product: build divopd's wheel, install it NOT editable into a fresh venv (torch pinned to
# the CPU build) by the README's install line, and from a folder outside the repository run the README's training line
# (the packaged setting copies the package's shipped models on first use), then a short run whose outputs are checked. Everything it makes lives in one temporary folder, removed at exit.
#   scripts/test-wheel.sh            (make test-wheel)
#   KEEP=1 scripts/test-wheel.sh     keeps the temporary folder and prints it
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/divopd-wheel.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then echo "test-wheel: keeping $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi
export PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
t0=$SECONDS

# 1. The wheel, built from a copy of what the build reads (an in-tree build/ folder would keep removed modules) with
#    build isolation: setuptools from the index, as any user gets it.
mkdir -p "$WORK/tree" && cp -r "$REPO/pyproject.toml" "$REPO/README.md" "$REPO/src" "$WORK/tree/"
"$PYTHON" -m pip wheel -q --no-deps -w "$WORK/dist" "$WORK/tree"
WHEEL=$(ls "$WORK"/dist/divopd-*.whl)
"$PYTHON" - "$WHEEL" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["divopd/configs/tiny.yaml", "divopd/configs/coin6-dart.yaml",
        "divopd/shipped/coin6-dart/teacher/model.safetensors", "divopd/shipped/coin6-dart/student/recipe-args.json"]
missing = [n for n in need if n not in names]
assert not missing, f"the wheel lacks {missing}"
print(f"test-wheel: {sys.argv[1].rsplit('/', 1)[-1]}: {len(names)} files, the configs and shipped models among them")
EOF

# 2. The README's two install lines, literally: the first in a copy of the clone, the second from a folder outside it.
#    Only the CPU torch is put in first (an unpinned torch would pull a CUDA build) and pip reads the constraints file
#    from PIP_CONSTRAINT, so the lines stay as the README writes them.
mapfile -t LINES < <(awk '/^## Install/{s=1} s&&/^```bash/{b=1;next} b&&/^```/{exit} b' "$REPO/README.md")
[ "${#LINES[@]}" = 2 ] || { echo "test-wheel: README's install block is not two lines: ${LINES[*]}"; exit 1; }
"$PYTHON" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
export PATH="$WORK/venv/bin:$PATH" PIP_CONSTRAINT="$REPO/constraints.txt"
"$VPY" -m pip install -q torch==2.13.0
(cd "$WORK/tree" && echo "test-wheel: \$ ${LINES[0]}" && eval "${LINES[0]}" -q)
echo "test-wheel: installed in $((SECONDS - t0))s"

# 3. From a folder outside the repository: nothing may come from the checkout.
mkdir -p "$WORK/run" && cd "$WORK/run"
"$VPY" -c 'import divopd; assert "site-packages" in divopd.__file__, divopd.__file__'  # not the checkout
"$WORK/venv/bin/divopd" train nosuch-setting 2>"$WORK/err.txt" && exit 1 || test $? = 2
grep -q "settings: alfworld, coin4" "$WORK/err.txt"
# The README's second line as written; it trains 150 updates, so once its first update is logged it gets a terminal's
# Ctrl-C (SIGINT to its process group): exit 130 with a checkpoint is the run working.
echo "test-wheel: \$ ${LINES[1]}"
set -m
eval "exec ${LINES[1]}" >"$WORK/readme-train.log" 2>&1 &  # exec: the job is divopd itself, as in a terminal
PID=$!
set +m
METRICS=runs/coin6-dart/vanilla/seed0/metrics.jsonl
for _ in $(seq 600); do
    grep -qsE '"kind": ?"update"' "$METRICS" && break
    kill -0 "$PID" 2>/dev/null || break
    sleep 1
done
kill -INT -- -"$PID" 2>/dev/null || true
rc=0; wait "$PID" || rc=$?
grep -qsE '"kind": ?"update"' "$METRICS" || { tail -20 "$WORK/readme-train.log"; exit 1; }
[ "$rc" = 130 ] || { echo "test-wheel: the README's run ended with exit $rc, not 130"; grep -v ' INFO ' "$WORK/readme-train.log" | tail -40; exit 1; }
[ "$(grep -c '^models: ' "$WORK/readme-train.log")" = 1 ] || { echo "test-wheel: not one line about the models"; exit 1; }
grep '^models: ' "$WORK/readme-train.log"
test -f cache/coin6-dart/teacher/model.safetensors && test -f cache/coin6-dart/student/sft.json
echo "test-wheel: ${LINES[1]}: trained, interrupted after its first update (exit 130), models copied once"

# 4. A short run with the experience log, its outputs checked.
"$WORK/venv/bin/divopd" train coin6-dart --method divopd --set updates=2 --set eval.at_start=false \
    --set eval.every=100 --set log_experience=true --run-dir run-divopd --no-progress >"$WORK/train.log" 2>&1 \
    || { tail -20 "$WORK/train.log"; exit 1; }
"$VPY" - <<'EOF'
import json
from pathlib import Path

run = Path("run-divopd")
summary = json.loads((run / "summary.json").read_text())
updates = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
updates = [r for r in updates if r.get("kind") == "update"]
assert summary["updates"] == 2 and not summary["interrupted"], summary
assert [r["update"] for r in updates] == [1, 2] and all(r["learner/loss"] == r["learner/loss"] for r in updates)
assert "method: divopd" in (run / "config.yaml").read_text() and any((run / "experience").glob("*.parquet"))
print(f"test-wheel: divopd train coin6-dart --method divopd: 2 updates, learner/loss "
      f"{[round(r['learner/loss'], 4) for r in updates]}")
EOF
echo "test-wheel: ok in $((SECONDS - t0))s"
