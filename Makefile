VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint format typecheck install engines-stop conformance interop-install bench bench-scale clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m elicit_hub.launch

test: $(STAMP)
	ELICIT_NAMESPACE=test $(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: $(STAMP)
	DJANGO_DEBUG=true $(VENV)/bin/mypy elicit_hub approvals bench

engines-stop: $(STAMP)
	$(PY) -m elicit_hub.engines stop

conformance: $(STAMP)
	bash .ci/conformance.sh

# The pinned third-party MCP servers of tests/interop (the tests install them too when missing).
interop-install:
	bash .ci/interop.sh

# Benchmarks, not shipped with the hub. The default runs every performance target in turn (about four minutes);
# one run alone: BENCH="load", "load --rate 20", "loop --calls 200", "live", "seed_audit --count N", "audit".
BENCH ?= suite
bench: $(STAMP)
	$(PY) -m bench $(BENCH)

# The load against 2 web processes, 2 workers and 2 holders, then against one of each: the ratio, and checks.
bench-scale: $(STAMP)
	$(PY) -m bench scale $(SCALE)

clean:
	-$(PY) -m elicit_hub.engines stop
	rm -rf var tests/artifacts
