"""Django's PostgreSQL backend on psycopg2 (``FENCING_DJANGO_DB=postgresql-psycopg2``),
as a project that has not moved to psycopg 3 runs it.

Django 4.2+ takes psycopg 3 whenever it is installed, and fencing's own store needs it:
psycopg 3 is hidden while Django's backend is imported (it then imports psycopg2), and
given back for fencing, whose store runs on it beside Django's psycopg2 connections."""

import sys

_hidden = sys.modules.get("psycopg")
sys.modules["psycopg"] = None  # type: ignore[assignment]  # import psycopg: ImportError
try:
    for _name in [m for m in sys.modules if m.startswith("django.db.backends.postgresql")]:
        del sys.modules[_name]
    from django.db.backends.postgresql import base as _base
finally:
    if _hidden is None:
        del sys.modules["psycopg"]
    else:
        sys.modules["psycopg"] = _hidden

assert _base.Database.__name__ == "psycopg2", _base.Database
DatabaseWrapper = _base.DatabaseWrapper
