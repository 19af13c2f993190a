"""The project's Celery app, the standard Django setup: settings from ``CELERY_*`` in
settings.py, every installed app's ``tasks`` module found by ``autodiscover_tasks``
(shop/tasks.py). ``celery -A testproject.celery worker`` runs it
(tests/django/test_celery_worker.py)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

app = Celery("testproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
