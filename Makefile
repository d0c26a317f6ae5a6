# Two commands on a fresh machine: `make run` and `make test`. Both set up .venv first: `run` with only
# what running needs, `test` (and install, lint, bench, flower) with the dev tools on top.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: install run test lint bench flower worker clean

install: $(DEV_STAMP)

$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUN_STAMP)

$(DEV_STAMP): $(RUN_STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(DEV_STAMP)

run: $(RUN_STAMP)
	$(BIN)/chordflow run examples/word_counts.json --input folder=examples/texts

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python -m bench

flower: install
	$(BIN)/chordflow flower $(FLOWER_ARGS)

worker: $(RUN_STAMP)
	$(BIN)/chordflow worker

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
