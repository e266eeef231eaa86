# Every target builds its own virtual environment, so a fresh clone needs only python3 >= 3.11.
# Nothing is taken from PATH but python3: the tests run the venv's own tools.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-unit test-integration test-system lint bench plan protos clean

# A strict editable install: site-packages gets a tree of links (build/__editable__.*) shaped
# like the installed package, so mypy and IDEs resolve secure_release.<layer> to the real files.
# Such a tree holds the files that existed when it was made: the install runs again whenever
# pyproject.toml changes or a module is added or removed (the list is kept in $(MODULES)).
MODULES := $(VENV)/.modules
SOURCES := $(sort $(wildcard app/*.py app/*/*.py mechanism/*.py infra/*.py curator/*.py server/*.py researcher/*.py protos/*.py protos/*/*.py protos/*/*/*.py))

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,plot]' --config-settings editable_mode=strict
	echo '$(SOURCES)' > $(MODULES)
	touch $(STAMP)

.PHONY: install
install: $(STAMP)
	@echo '$(SOURCES)' | cmp -s - $(MODULES) || { \
	  $(PY) -m pip install --quiet --no-deps -e . --config-settings editable_mode=strict \
	  && echo '$(SOURCES)' > $(MODULES); }

demo: install
	$(VENV)/bin/secure-release demo

plan: install
	$(VENV)/bin/secure-release plan --n 45222 --alphabet 6,4 --epsilon 0.5

# The whole suite: the unit tier and the integration tier (servers and processes on 127.0.0.1).
test: install
	$(PY) -m pytest

# One tier at a time: unit (no sockets, no processes: tests/guard.py fails a test that opens
# one), integration (in-process gRPC on 127.0.0.1 port 0), system (child processes, compose,
# demo, faults, packaging).
test-unit: install
	$(PY) -m pytest tests/unit

test-integration: install
	$(PY) -m pytest tests/integration

test-system: install
	$(PY) -m pytest tests/system

lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy -p secure_release

protos: install
	$(PY) -m secure_release.protos.generate

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]' --config-settings editable_mode=strict
	$(PY) bench/bench_mechanism.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
