"""The test project with what ``manage.py check`` must warn about: a fenced model
without its VersionField (app ``broken``), a default database fencing cannot reach (in
memory) and one it has no backend for (``legacy``, in ``FENCING["OPTIONS"]``)."""

from .settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "broken"]  # noqa: F405
DATABASES = {
    **DATABASES,  # noqa: F405
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    "legacy": {"ENGINE": "django.db.backends.dummy"},
}
FENCING = {**FENCING, "OPTIONS": {"legacy": {}}}  # noqa: F405
