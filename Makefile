# One command to serve on the embedded default, one to run the tests.
# Both build the virtualenv first, from scratch on a fresh machine.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install serve test lint format

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

serve: install
	$(BIN)/recall serve

test: install
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
