# Every target builds its own virtual environment, so a fresh clone needs only python3 >= 3.11.
# Nothing is taken from PATH but python3: the tests run the venv's own tools.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-unit test-integration test-system test-oldest lint bench plan protos clean

# A strict editable install: site-packages gets a tree of links (build/__editable__.*) shaped
# like the installed package, so mypy and IDEs resolve secure_release.<layer> to the real files.
# Such a tree holds the files that existed when it was made: the install runs again whenever
# pyproject.toml changes or a module is added or removed (the list is kept in $(MODULES)).
MODULES := $(VENV)/.modules
SOURCES := $(sort $(wildcard app/*.py app/*/*.py mechanism/*.py mechanism/*/*.py infra/*.py curator/*.py curator/*/*.py server/*.py researcher/*.py protos/*.py protos/*/*.py protos/*/*/*.py))

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
	$(VENV)/bin/secure-release demo --question "salary ~ education | sex"

plan: install
	$(VENV)/bin/secure-release plan --n 45222 --alphabet 6,4 --epsilon 0.5

# pytest-xdist runs the tests across the cores (WORKERS=1 runs them in this process); each file's
# tests stay on one worker (--dist loadfile), so a module fixture (a server, a wheel) is made once.
# pytest's exit 5 (it collected no test) is said aloud and fails the target: never a silent pass.
WORKERS ?= auto
XDIST   := $(if $(filter 1,$(WORKERS)),-p no:xdist,-n $(WORKERS) --dist loadfile)
define pytest
	$(1) -m pytest $(XDIST) $(2) || { rc=$$?; [ $$rc -ne 5 ] || echo "make $@: pytest collected no test in $(or $(2),tests)" >&2; exit $$rc; }
endef

# The whole suite: the unit tier and the integration tier (servers and processes on 127.0.0.1).
test: install
	$(call pytest,$(PY))

# One tier at a time: unit (no sockets, no processes: tests/guard.py fails a test that opens
# one), integration (in-process gRPC on 127.0.0.1 port 0), system (child processes, compose,
# demo, faults, packaging).
test-unit: install
	$(call pytest,$(PY),tests/unit)

test-integration: install
	$(call pytest,$(PY),tests/integration)

test-system: install
	$(call pytest,$(PY),tests/system)

# The oldest dependency set: every lower bound of pyproject.toml pinned at its minimum
# (constraints/oldest.txt) in a venv of its own, and the unit tier run in it; the unit tier holds
# every input test (marker `inputs`), and the input tests outside it need sockets or processes.
# The whole suite runs on the newest set (`make test`).
OLDEST    ?= .venv-oldest
OLDEST_PY := $(OLDEST)/bin/python

$(OLDEST)/.installed: pyproject.toml constraints/oldest.txt
	rm -rf $(OLDEST)
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST_PY) -m pip install --quiet --upgrade pip
	$(OLDEST_PY) -m pip install --quiet -c constraints/oldest.txt -e '.[test,notebook,duckdb,plot]' \
	  --config-settings editable_mode=strict
	@echo '$(SOURCES)' > $(OLDEST)/.modules
	touch $@

.PHONY: install-oldest
install-oldest: $(OLDEST)/.installed
	@echo '$(SOURCES)' | cmp -s - $(OLDEST)/.modules || { \
	  $(OLDEST_PY) -m pip install --quiet --no-deps -e . --config-settings editable_mode=strict \
	  && echo '$(SOURCES)' > $(OLDEST)/.modules; }

test-oldest: install-oldest
	$(call pytest,$(OLDEST_PY),tests/unit)

lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy -p secure_release

protos: install
	$(PY) -m secure_release.protos.generate

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]' --config-settings editable_mode=strict
	$(PY) bench/bench_mechanism.py

clean:
	rm -rf $(VENV) $(OLDEST) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
