# hlotk: `make demo` and `make test` need only Python >= 3.11 and pip; both create .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test clean

venv: $(STAMP)

# Reinstall only when pyproject.toml changes (the stamp is newer otherwise).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e '.[dev]'
	@touch $(STAMP)

demo: venv
	@if ! command -v dot >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    apt-get update && apt-get install -y graphviz; \
	  else \
	    echo "graphviz 'dot' not found: install it (e.g. 'sudo apt-get install graphviz' or 'brew install graphviz') for graph drawings; continuing without it"; \
	  fi; \
	fi
	$(PY) examples/transformer_block.py

# pytest-xdist with at most 2 workers: `-n auto` capped at 2.
test: venv
	@N=$$($(PY) -c "import os; print(min(2, os.cpu_count() or 1))"); \
	$(PY) -m pytest -q -n $$N tests/

clean:
	rm -rf out/ .pytest_cache
