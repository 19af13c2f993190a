"""A fenced Celery task on the shop's orders (the outbox admin's rows, and the test
helper that runs fenced tasks on the test's connection). No broker is needed: the
tests run the task eagerly (``apply()``) or only write its outbox rows."""

from celery import Celery

from fencing.contrib.celery import fenced_task
from fencing.contrib.django import store

from .models import Order

app = Celery("shop", set_as_current=False)


@fenced_task(app, target=lambda: store().table(Order))
def ship(record):
    return {"status": "shipped"}
