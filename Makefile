# Two commands on a fresh machine: `make demo` (set up + quickstart), `make test` (set up + tests).
VENV       ?= .venv
PY         := $(VENV)/bin/python
# This machine has a CPU build of torch 2.13.0 on disk; elsewhere pick yours (e.g. TORCH_SPEC=torch).
TORCH_SPEC ?= torch==2.13.0
# Test processes of `make test` (pytest-xdist; a file's tests stay in one process, its fixtures shared).
TEST_WORKERS ?= 2
SYSTEM_PACKAGES := bubblewrap libseccomp2
# The run report's browser test drives Debian's Chromium through playwright (no browser download).
BROWSER_PACKAGES := chromium
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup browser demo test test-slow test-all test-compat bench bench-curriculum bench-algorithms bench-trl bench-dpo-trl bench-rm-trl bench-gpu check-sandbox clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	@# System packages for the sandbox (bubblewrap backend, libseccomp), when run as root.
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		! dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1; then \
		apt-get install -y -q $(SYSTEM_PACKAGES) >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q $(SYSTEM_PACKAGES) >/dev/null) || \
		echo "warning: could not install $(SYSTEM_PACKAGES); 'rlvr sandbox info' says what is missing"; fi
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

demo: setup
	$(VENV)/bin/rlvr quickstart

# A headless Chromium for tests/test_report_browser.py (skipped, saying why, where none can be installed).
browser:
	@if ! command -v chromium >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q $(BROWSER_PACKAGES) >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q $(BROWSER_PACKAGES) >/dev/null) || \
		echo "warning: could not install $(BROWSER_PACKAGES); the report's browser test will skip"; fi

# Tiny models on 2 shared cores run fastest (and never oversubscribed) on one thread.
test: setup browser
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs --durations=15 -n $(TEST_WORKERS) --dist loadfile

test-slow: setup
	$(PY) -m pytest -q -rs -m slow

test-all: setup
	$(PY) -m pytest -q -m "slow or not slow"

bench: setup
	$(PY) benchmarks/quickstart_stages.py --json runs/bench/quickstart_stages.json
	$(PY) benchmarks/sandbox_bench.py --json runs/bench/sandbox_bench.json
	$(PY) benchmarks/sandbox_snapshot.py --json runs/bench/sandbox_snapshot.json
	$(PY) benchmarks/rollout_throughput.py --json runs/bench/rollout_throughput.json
	$(PY) benchmarks/async_vs_sync.py --json runs/bench/async_vs_sync.json
	$(PY) benchmarks/sandbox_hostile.py --json runs/bench/sandbox_hostile.json
	$(PY) benchmarks/ray_verify.py --json runs/bench/ray_verify.json
	$(PY) benchmarks/memory_step.py --json runs/bench/memory_step.json
	$(PY) benchmarks/math_agreement.py --json runs/bench/math_agreement.json
	$(PY) benchmarks/alert_push.py --json runs/bench/alert_push.json
	$(PY) benchmarks/tool_grants.py --json runs/bench/tool_grants.json
	$(PY) benchmarks/render_svg.py --json runs/bench/render_svg.json
	$(PY) benchmarks/cad_shapes.py --json runs/bench/cad_shapes.json
	$(PY) benchmarks/data_analysis.py --json runs/bench/data_analysis.json
	$(PY) benchmarks/learnability.py --json runs/bench/learnability.json

# Model loading on the lowest transformers pyproject.toml allows (the newest is what `make test` gets),
# in its own venv (.venv-compat).
COMPAT_VENV         ?= .venv-compat
COMPAT_TRANSFORMERS ?= transformers==4.45.2

$(COMPAT_VENV)/.installed: pyproject.toml Makefile
	test -x $(COMPAT_VENV)/bin/python || python3 -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install -q --upgrade pip
	$(COMPAT_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)" "$(COMPAT_TRANSFORMERS)"
	$(COMPAT_VENV)/bin/python -m pip install -q -e ".[dev]" "$(COMPAT_TRANSFORMERS)"
	touch $@

test-compat: $(COMPAT_VENV)/.installed
	OMP_NUM_THREADS=1 $(COMPAT_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_model_load.py

# GRPO step vs TRL's GRPOTrainer. TRL lives in its own venv (.venv-trl), never in rlvr's dependencies.
TRL_VENV   ?= .venv-trl
TRL_SPEC   ?= trl==1.16.0

$(TRL_VENV)/.installed: pyproject.toml Makefile
	test -x $(TRL_VENV)/bin/python || python3 -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/python -m pip install -q --upgrade pip
	$(TRL_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(TRL_VENV)/bin/python -m pip install -q "$(TRL_SPEC)"
	$(TRL_VENV)/bin/python -m pip install -q -e .
	touch $@

# The curriculum against uniform sampling from the quickstart's SFT model (3 seeds x 2 arms x 200
# GRPO steps, about 40 min on 2 idle cores; runs the quickstart first when its SFT model is missing).
bench-curriculum: setup
	test -f runs/quickstart/sft/final/config.json || $(VENV)/bin/rlvr quickstart
	$(PY) benchmarks/curriculum_vs_uniform.py --model runs/quickstart/sft/final --steps 200 --seeds 0 1 2 \
		--json runs/bench/curriculum_vs_uniform.json --png runs/bench/curriculum_vs_uniform.png

# Seven policy-gradient algorithms on the quickstart's GRPO stage from its SFT model (7 arms x 3 seeds
# x 100 steps, each a fresh process; about 70 min on 2 idle cores; runs the quickstart first when missing).
bench-algorithms: setup
	test -f runs/quickstart/sft/final/config.json || $(VENV)/bin/rlvr quickstart
	$(PY) benchmarks/algorithms.py --model runs/quickstart/sft/final --steps 100 --seeds 0 1 2 \
		--json runs/bench/algorithms.json --png runs/bench/algorithms.png

bench-trl: $(TRL_VENV)/.installed
	$(TRL_VENV)/bin/python benchmarks/grpo_step_vs_trl.py --size small --json runs/bench/grpo_step_vs_trl_small.json
	$(TRL_VENV)/bin/python benchmarks/grpo_step_vs_trl.py --size medium --json runs/bench/grpo_step_vs_trl_medium.json

# Preference losses (sigmoid/cDPO, robust, ipo, simpo) vs TRL's DPOTrainer and CPOTrainer, same ids; exits 1 above 1e-5.
bench-dpo-trl: $(TRL_VENV)/.installed
	$(TRL_VENV)/bin/python benchmarks/dpo_vs_trl.py --json runs/bench/dpo_vs_trl.json

# The reward-model loss (Bradley-Terry, margin, centering) vs TRL's RewardTrainer, same ids; exits 1 above 1e-5.
bench-rm-trl: $(TRL_VENV)/.installed
	$(TRL_VENV)/bin/python benchmarks/rm_vs_trl.py --json runs/bench/rm_vs_trl.json

# The GPU check of issue 6 (engine + GRPO step on CUDA in bf16, ~150M model). On a GPU machine
# install a CUDA build of torch: `make bench-gpu TORCH_SPEC=torch` (a fresh venv, or VENV=...).
bench-gpu: setup
	$(PY) benchmarks/gpu_step.py --json runs/bench/gpu_step.json
	$(PY) benchmarks/gpu_step.py --skip-rollout --compile --json runs/bench/gpu_step_compile.json
	$(PY) -m pytest -q -m gpu

check-sandbox: setup
	$(VENV)/bin/rlvr sandbox check

clean:
	rm -rf $(VENV) $(TRL_VENV) $(COMPAT_VENV) runs .pytest_cache
