"""The test project with a second database, ``other``, that a router keeps fencing's
tables (and the app ``guarded``) off (tests/django/test_migrations.py)."""

import os

from .settings import *  # noqa: F403

DATABASES = {
    **DATABASES,  # noqa: F405
    "other": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(HERE, "other.sqlite3"),  # noqa: F405
    },
}
DATABASE_ROUTERS = ["testproject.routers.NoFencingOnOther"]
