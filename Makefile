# hlotk: `make demo` and `make test` need only Python >= 3.11 and pip; both create .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test clean browser

venv: $(STAMP)

# Reinstall only when pyproject.toml changes (the stamp is newer otherwise).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -e '.[dev]'
	@touch $(STAMP)

demo: venv
	@if ! command -v dot >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    (apt-get update && apt-get install -y graphviz) \
	      || echo "could not install graphviz: continuing without graph drawings"; \
	  else \
	    echo "graphviz 'dot' not found: install it (e.g. 'sudo apt-get install graphviz' or 'brew install graphviz') for graph drawings; continuing without it"; \
	  fi; \
	fi
	$(PY) examples/transformer_block.py

# The viewer's browser test drives Debian's headless Chromium (tests/test_viewer_browser.py);
# installed here when running as root, else that test is skipped and says why.
browser:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver) \
	      || echo "could not install chromium: the viewer's browser test will be skipped"; \
	  else \
	    echo "chromium/chromedriver not found and not root: the viewer's browser test will be skipped"; \
	  fi; \
	fi

# pytest-xdist with at most 2 workers: `-n auto` capped at 2.
test: venv browser
	@N=$$($(PY) -c "import os; print(min(2, os.cpu_count() or 1))"); \
	$(PY) -m pytest -q -n $$N tests/

clean:
	rm -rf out/ .pytest_cache
