"""A fresh process whose first use of fencing is inside an ``atomic()`` block that
wrote (SQLite): it must not wait on its own write lock. Run by test_django.py."""

import os
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from shop.models import Order  # noqa: E402

from fencing.contrib.django import close_stores  # noqa: E402

call_command("migrate", verbosity=0)
connection.close()
close_stores()  # as in a new process: no store yet, no connection yet
started = time.monotonic()
with transaction.atomic():
    order = Order.objects.create(status="paid")  # this transaction holds the write lock
    intent = order.intent("ship")
print(intent.expected_version, round(time.monotonic() - started, 3))
