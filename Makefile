# The README's two commands: `make demo` and `make test`. Both work from a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
TEST_EXTRAS := dev,cli,postgres,psycopg2,mysql,redis,celery,rq,dramatiq,arq,sqlalchemy,alembic,prometheus,otel,django,drf,flask,fastapi,http-tests,bench

.PHONY: demo test lint bench mutate clean

$(PY):
	$(PYTHON) -m venv $(VENV)

demo: $(PY)
	$(PIP) -e '.[cli]'
	$(VENV)/bin/fencing demo

test: $(PY)
	$(PIP) -e '.[$(TEST_EXTRAS)]'
	@# mysqlclient builds from source (the MariaDB client headers, pkg-config): without
	@# them its tests skip, and fail under CI (.ci/run installs them)
	$(PIP) -e '.[mysqlclient]' || echo "make: mysqlclient not installed (apt-get install libmariadb-dev pkg-config)" >&2
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy --strict src
	$(PY) scripts/unasync.py --check
	$(PY) -m pytest

# Mutation testing of the core (mutmut; what and against which tests: pyproject's
# [tool.mutmut]); not in CI, about 50 minutes on 2 busy cores. Writes mutation/REPORT.md.
mutate: $(PY)
	$(PIP) -e '.[$(TEST_EXTRAS),mutate]'
	@echo "mutating fencing's core; the tests: the fast, server-free ones"
	rm -rf mutants
	$(VENV)/bin/mutmut run
	$(PY) scripts/mutation_report.py

bench: $(PY)
	$(PIP) -e '.[cli]'
	$(VENV)/bin/fencing bench

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache .hypothesis mutants
