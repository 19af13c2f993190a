"""A fenced Celery task on a real broker (Redis database 11, the Celery tests' own):
tests/django/test_migrations.py writes its outbox rows and relays them with
``manage.py fencing_relay --queue celery --app shop.queue:app``."""

from celery import Celery

from fencing.contrib.celery import fenced_task
from fencing.contrib.django import store

from .models import Order

app = Celery("shop", broker="redis://127.0.0.1:6379/11", set_as_current=False)


@fenced_task(app, target=lambda: store().table(Order))
def ship(record):
    return {"status": "shipped"}
