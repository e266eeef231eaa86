# Every target builds its own virtual environment, so a fresh clone needs only python3 >= 3.11.
# Nothing is taken from PATH but python3: the tests run the venv's own tools.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-unit lint bench plan protos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,plot]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/secure-release demo

plan: $(STAMP)
	$(VENV)/bin/secure-release plan --n 45222 --alphabet 6,4 --epsilon 0.5

# The whole suite: the unit tier and the integration tier (servers and processes on 127.0.0.1).
test: $(STAMP)
	$(PY) -m pytest

# The fast unit tier only (no servers, no subprocesses).
test-unit: $(STAMP)
	$(PY) -m pytest -m "not integration"

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy -p secure_release

protos: $(STAMP)
	$(PY) -m secure_release.protos.generate

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/bench_mechanism.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
