"""enqueue_on_commit and outbox_send with a real fenced Celery task (run eagerly: no
broker), on each database (tests/django/test_django.py runs it with the rest; named so
that pytest does not collect it)."""

from celery import Celery
from django.db import transaction
from django.test import TransactionTestCase

import fencing
from fencing.contrib.celery import fenced_task
from fencing.contrib.django import enqueue_on_commit, outbox_send, store

from .models import Order

app = Celery("shop_tests", set_as_current=False)
app.conf.task_always_eager = True
app.conf.task_eager_propagates = True
decided: list[tuple[int, int]] = []  # (pk, the version the task found), per run


@fenced_task(app, target=lambda: store().table(Order))
def ship(record):
    decided.append((record.key, record.version))
    return {"status": "shipped"}


class Rollback(Exception):
    pass


class EnqueueOnCommit(TransactionTestCase):
    def setUp(self):
        decided.clear()

    def test_nothing_is_sent_when_the_transaction_rolls_back(self):
        order = Order.objects.create(status="paid")
        with self.assertRaises(Rollback), transaction.atomic():
            order.note = "to ship"
            order.save()
            enqueue_on_commit(ship, order, "ship")
            raise Rollback
        self.assertEqual(decided, [])
        self.assertEqual(Order.objects.get(pk=order.pk).status, "paid")

    def test_sent_once_after_the_commit_at_the_last_saved_version(self):
        order = Order.objects.create(status="paid")
        with transaction.atomic():
            enqueue_on_commit(ship, order, "ship")
            self.assertEqual(decided, [])  # not before the COMMIT
            order.note = "gift wrap"
            order.save()  # version 2, after the call: the intent is still fresh
        self.assertEqual(decided, [(order.pk, 2)])
        row = Order.objects.get(pk=order.pk)
        self.assertEqual((row.status, row.version), ("shipped", 3))

    def test_outside_a_transaction_it_is_sent_at_once(self):
        order = Order.objects.create(status="paid")
        enqueue_on_commit(ship, order, "ship")
        self.assertEqual(decided, [(order.pk, 1)])

    def test_a_plain_callable_gets_the_intent_and_the_options(self):
        order = Order.objects.create(status="paid")
        got = []
        with transaction.atomic():
            enqueue_on_commit(lambda intent, **kw: got.append((intent, kw)), order, "pack", n=1)
        ((intent, options),) = got
        self.assertEqual(
            (intent.kind, intent.collection, intent.key, intent.expected_version),
            ("table", "shop_order", order.pk, 1),
        )
        self.assertEqual((intent.transition, options), ("pack", {"n": 1}))

    def test_an_unsaved_instance_is_refused(self):
        with self.assertRaises(ValueError):
            enqueue_on_commit(ship, Order(status="new"), "ship")


class OutboxSend(TransactionTestCase):
    def mine(self, order):
        return [
            row
            for row in store().outbox.pending(kind="celery", limit=10_000)
            if fencing.Intent.from_json(row.payload).key == order.pk
            and fencing.Intent.from_json(row.payload).collection == "shop_order"
        ]

    def test_the_row_is_rolled_back_with_the_transaction(self):
        order = Order.objects.create(status="paid")
        with self.assertRaises(Rollback), transaction.atomic():
            order.note = "to ship"
            order.save()
            outbox_send(ship, order, "ship")
            raise Rollback
        self.assertEqual(self.mine(order), [])

    def test_the_row_is_committed_with_the_transaction(self):
        order = Order.objects.create(status="paid")
        with transaction.atomic():
            order.note = "to ship"
            order.save()
            row = outbox_send(ship, order, "ship", countdown=5)
        (found,) = self.mine(order)
        self.assertEqual(
            (found.id, found.task, dict(found.options)), (row.id, ship.name, {"countdown": 5})
        )
        intent = fencing.Intent.from_json(found.payload)
        self.assertEqual((intent.transition, intent.expected_version), ("ship", 2))
