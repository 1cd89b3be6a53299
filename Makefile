# Two commands for a newcomer: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0

.PHONY: setup demo test test-all test-cpu-variants lint bench gpu-check gpu-bench clean reference

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch==2.13.0 first: any looser spec pulls a multi-GB CUDA build on a CPU machine.
$(STAMP): $(PY) pyproject.toml
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) examples/train.py --artifact-dir demo_run --log-every 1
	$(PY) examples/evaluate.py --checkpoint-dir demo_run/checkpoints --artifact-dir demo_run

# The comparisons with numbers made on another CPU run twice: with this CPU's own float kernels,
# and again with ATen's portable kernels and MKL's compatible code path, so a bound that holds
# on one instruction set only fails here rather than on the next machine (the same tests both
# times: those marked slow run in neither).
test: setup
	$(PY) -m pytest -q -m "not slow"
	ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE $(PY) -m pytest -q -m "cross_cpu and not slow"

# Every float-kernel setting the cross-CPU comparisons are held to (x86-64; each a full rerun).
CPU_VARIANTS := ATEN_CPU_CAPABILITY=default ATEN_CPU_CAPABILITY=avx2 ATEN_CPU_CAPABILITY=avx512 \
	MKL_CBWR=COMPATIBLE MKL_CBWR=AVX2 MKL_CBWR=AVX512
test-cpu-variants: setup
	@for v in $(CPU_VARIANTS); do echo "== $$v"; env $$v $(PY) -m pytest -q -m cross_cpu || exit 1; done

test-all: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check cstream cstream_tools workers executor tests examples benchmarks tools

bench: setup
	$(PY) -m benchmarks.step_replay
	$(PY) -m benchmarks.input_scaling

# On a machine with a CUDA GPU, with the machine's own torch (no venv: `setup` would install
# another torch): the examples, the model set on a CUDA wafer and the CUDA tests, in under 5
# minutes; writes benchmarks/results/gpu_check.json. GPU_CHECK_ARGS="--device cpu" is the dry
# run on a CPU, "--ray no" leaves out the Ray rows.
gpu-check:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# On one CUDA GPU, with the machine's own torch: the CUDA graph's tests, then the training
# speed of eager PyTorch, torch.compile, the GPU backend and the CUDA wafer with and without
# its CUDA graph (about 5 minutes); writes benchmarks/results/gpu.json and the table of
# docs/performance.md. GPU_BENCH_ARGS="--device cpu --quick" is the dry run on a CPU.
gpu-bench:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m pytest -q -m "cuda and not slow" tests/test_cuda_graph.py -p no:cacheprovider; \
	PYTHONPATH=$(CURDIR) $(PYTHON) -m benchmarks.gpu --docs $(GPU_BENCH_ARGS)

# The real cerebras-pytorch package in a venv of its own (it pins torch 2.4.0, a CUDA build of
# about 5.7 GB) rewrites tests/reference/fixtures/. Never part of `make test`.
REF_VENV ?= $(HOME)/.cache/cstream/reference-venv
reference:
	test -x $(REF_VENV)/bin/python || python3.11 -m venv $(REF_VENV)
	$(REF_VENV)/bin/pip install -q cerebras-pytorch==2.10.0
	cd tests && $(REF_VENV)/bin/python -m reference.generate

clean:
	rm -rf $(VENV) demo_run .pytest_cache
