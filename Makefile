# Two commands on a fresh machine: `make run` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test lint bench flower worker clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: install
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

worker: install
	$(BIN)/chordflow worker

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
