"""The test project with the app ``audited`` (the strict guard and the blind-writer
audit: tests/django/test_audit.py runs audited/pytest_audit.py under pytest-django)."""

from .settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "audited"]  # noqa: F405
