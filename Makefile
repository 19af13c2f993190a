# The README's two commands: `make demo` and `make test`. Both work from a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
TEST_EXTRAS := dev,cli,postgres,mysql,redis,celery,rq,dramatiq,arq,sqlalchemy,alembic,prometheus,otel,django

.PHONY: demo test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

demo: $(PY)
	$(PIP) -e '.[cli]'
	$(VENV)/bin/fencing demo

test: $(PY)
	$(PIP) -e '.[$(TEST_EXTRAS)]'
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy --strict src
	$(PY) scripts/unasync.py --check
	$(PY) -m pytest

bench: $(PY)
	$(PIP) -e '.[cli]'
	$(VENV)/bin/fencing bench

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache .hypothesis
