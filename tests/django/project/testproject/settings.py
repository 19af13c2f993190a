"""A small Django project on the database ``FENCING_DJANGO_DB`` names (sqlite,
postgresql (psycopg 3), postgresql-psycopg2, mysql (MariaDB/MySQL through PyMySQL
installed as MySQLdb) or mysql-mysqlclient (mysqlclient, Django's default)).

``FENCING_DJANGO_DIR``: where the SQLite files go; ``FENCING_DJANGO_TEST_NAME``: the
test database's name (unique per run, so concurrent runs do not meet)."""

import os
import tempfile

VENDOR = os.environ.get("FENCING_DJANGO_DB", "sqlite")
HERE = os.environ.get("FENCING_DJANGO_DIR") or tempfile.gettempdir()
TEST_NAME = os.environ.get("FENCING_DJANGO_TEST_NAME", "test_fencing_django")
#: the (non-test) database's name on PostgreSQL and MariaDB
NAME = os.environ.get("FENCING_DJANGO_NAME", "fencing_django")

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "fencing.contrib.django",
    "shop",
    "guarded",
]
if VENDOR == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.path.join(HERE, "shop.sqlite3"),
            # fencing's own connections reach a file, not Django's in-memory test database
            "TEST": {"NAME": os.path.join(HERE, f"{TEST_NAME}.sqlite3")},
        }
    }
elif VENDOR in ("postgresql", "postgresql-psycopg2"):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql"
            if VENDOR == "postgresql"
            else "testproject.psycopg2_backend",  # Django's backend, on psycopg2
            "NAME": NAME,
            "USER": "root",
            "HOST": "127.0.0.1",
            "PORT": "5432",
            "TEST": {"NAME": TEST_NAME},
        }
    }
elif VENDOR in ("mysql", "mysql-mysqlclient"):
    if VENDOR == "mysql":  # else mysqlclient, Django's default MySQL driver
        import pymysql

        pymysql.install_as_MySQLdb()
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": NAME,
            "USER": "root",
            "HOST": "127.0.0.1",
            "PORT": "3306",
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {"NAME": TEST_NAME},
        }
    }
else:
    raise RuntimeError(
        f"FENCING_DJANGO_DB={VENDOR!r}: sqlite, postgresql, postgresql-psycopg2, mysql or"
        " mysql-mysqlclient"
    )

FENCING = {"SIGNING_KEYS": {"k1": "tests-only-secret"}}
if os.environ.get("FENCING_DJANGO_MIGRATE"):  # "check": the tables are the migrations' to make
    FENCING["MIGRATE"] = os.environ["FENCING_DJANGO_MIGRATE"]
if VENDOR.startswith("postgresql"):  # fencing's own tables in a schema of their own
    FENCING["OPTIONS"] = {"default": {"schema": "fencing", "max_size": 4}}

# Never connected to (no test uses them): what database_url() makes of odd settings.
DATABASES["odd"] = {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": "shop db",
    "USER": "ro@t",
    "PASSWORD": "p@ss:w/rd",
    "HOST": "/var/run/postgresql",
    "OPTIONS": {"sslmode": "disable", "server_side_binding": False},
}
DATABASES["memory"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}

# The admin (fencing.contrib.django.admin: the change form of a FencedModel, the
# recorded effects and the outbox), tested through Django's test client.
INSTALLED_APPS += [
    # django.contrib.admin whose admin.site fences every FencedModel registered on it
    "fencing.contrib.django.adminapp.FencedAdminConfig",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "testproject.urls"
STATIC_URL = "/static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
INSTALLED_APPS += ["lines"]  # a FencedModel in the admin's inlines (shop/admin.py)

# Celery, the standard Django way (testproject/celery.py): a real worker runs shop/tasks.py
# in tests/django/test_celery_worker.py, on Redis database 11 (the Celery tests' own),
# its keys under a prefix of the run's own.
CELERY_BROKER_URL = os.environ.get("FENCING_DJANGO_BROKER", "redis://127.0.0.1:6379/11")
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "global_keyprefix": os.environ.get("FENCING_DJANGO_PREFIX", "fencing_django") + ":"
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("FENCING_DJANGO_QUEUE", "fencing_django")
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
CELERY_WORKER_SEND_TASK_EVENTS = False
