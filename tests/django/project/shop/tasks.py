"""The shop's fenced Celery tasks, found by ``app.autodiscover_tasks()``
(testproject/celery.py), committing to ``target=Order``.

``FENCING_DJANGO_CONTROL`` (a directory; set by tests/django/test_celery_worker.py):
each run's outcome is written there (``outcome-<intent id>-<n>``), and a run whose
intent has a ``hang-<intent id>`` file there stops after its commit, before Celery
acknowledges the message, until the test kills its process (once: ``hung-<intent id>``
says where)."""

import os
import time
import uuid
from pathlib import Path

from testproject.celery import app

from fencing.contrib.celery import fenced_task

from .models import Order


def _after(report):
    control = os.environ.get("FENCING_DJANGO_CONTROL")
    intent = report.intent
    if not control or intent is None:
        return
    where = Path(control)
    name = f"outcome-{intent.id}-{uuid.uuid4().hex}"
    (where / f".{name}").write_text(f"{report.kind} {os.getpid()}")
    (where / f".{name}").rename(where / name)
    if report.kind == "committed" and (where / f"hang-{intent.id}").exists():
        hung = where / f"hung-{intent.id}"
        if not hung.exists():
            (where / f".hung-{intent.id}").write_text(str(os.getpid()))
            (where / f".hung-{intent.id}").rename(hung)
            time.sleep(600)  # the test SIGKILLs this process long before


@fenced_task(app, target=Order, on_outcome=_after)
def ship(record):
    return {"status": "shipped"}


@fenced_task(app, target=Order, on_outcome=_after)
def add_fee(record):
    return {"fee": record.state["fee"] + 5}
