#!/usr/bin/env bash
# The installable product (issue 45): build divopd's wheel, install it NOT editable into a fresh venv (torch pinned to
# the CPU build), and from a folder outside the repository train a short lockstep run from a packaged setting with the
# package's shipped models; check the run's outputs. Everything it makes lives in one temporary folder, removed at exit.
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

# 2. A fresh venv: the CPU torch first, then the wheel (not editable) with the game the packaged CPU settings play.
"$PYTHON" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
"$VPY" -m pip install -q -c "$REPO/constraints.txt" torch==2.13.0
"$VPY" -m pip install -q -c "$REPO/constraints.txt" "$WHEEL" textworld-express
echo "test-wheel: installed in $((SECONDS - t0))s"

# 3. From a folder outside the repository: nothing may come from the checkout.
mkdir -p "$WORK/run" && cd "$WORK/run"
"$VPY" - <<'EOF'
from pathlib import Path

import divopd
from divopd.suite.models import SHIPPED, prepare_models

assert "site-packages" in divopd.__file__, divopd.__file__  # the installed wheel, not the checkout
# the shipped models of coin6-dart, copied where the packaged setting reads them (cache/coin6-dart, relative to here)
prepare_models(Path("cache/coin6-dart"), "coin6-dart", shipped=SHIPPED / "coin6-dart")
EOF
"$WORK/venv/bin/divopd" train nosuch-setting 2>"$WORK/err.txt" && exit 1 || test $? = 2
grep -q "settings: alfworld, coin4" "$WORK/err.txt"
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
