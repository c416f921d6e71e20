# One command to serve on the embedded default, one to check it, one to run the tests, one to lint.
# Each builds the virtualenv first, from scratch on a fresh machine.

# pyproject.toml asks for Python 3.11: python3.11 where there is one, else python3
# (which must then be 3.11). PYTHON=/path/to/python3.11 chooses another.
PYTHON ?= $(shell command -v python3.11 2>/dev/null || echo python3)
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: install serve doctor test lint format

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || { \
	  echo "Recall needs Python 3.11, and $(PYTHON) is $$($(PYTHON) -V 2>/dev/null || echo missing)." \
	    "Install it, or name it: make $(MAKECMDGOALS) PYTHON=/path/to/python3.11" >&2; exit 1; }
	@# A virtualenv made by another Python (an earlier try with 3.12) would keep it.
	@if [ -x $(BIN)/python ] && ! $(BIN)/python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then \
	  echo "$(VENV) was made with another Python: making it again with $(PYTHON)." >&2; rm -rf $(VENV); fi
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

serve: install
	$(BIN)/recall serve

doctor: install
	$(BIN)/recall doctor

test: install
	$(BIN)/pytest

# mypy's Django plugin imports recall.settings and runs django.setup(). Given
# the two secrets it writes nothing into the data directory, and given a
# DATABASE_URL (never connected to) settings pick the stock PostgreSQL backend:
# the embedded one starts its server as soon as setup builds a connection
# wrapper, and lint left one running on ~/.local/share/recall.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	DATABASE_URL=postgres://mypy@127.0.0.1:9/mypy SECRET_KEY=mypy API_KEY_SECRET=mypy $(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
