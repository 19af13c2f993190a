"""fencing.contrib.django.testing: fenced tasks run eagerly inside a TestCase commit
through the test's connection, so they see the test's rows."""

from django.test import TestCase

import fencing
from fencing.contrib.django.testing import FencedTasksMixin, run_task

from .jobs import ship
from .models import Order


class RunTask(TestCase):
    def test_a_fenced_task_sees_the_tests_rows_and_commits(self):
        order = Order.objects.create(status="paid")  # uncommitted: the test's transaction
        report = run_task(ship, order, "ship")
        self.assertIsInstance(report.outcome, fencing.Committed)
        self.assertEqual(Order.objects.values_list("status", "version").get(), ("shipped", 2))
        order.refresh_from_db()
        order.note = "saved after the task"
        order.save()  # the instance moved on with the row: no StaleSave
        self.assertEqual(order.version, 3)

    def test_a_redelivered_task_is_duplicate(self):
        order = Order.objects.create(status="paid")
        intent = order.intent("ship")
        self.assertEqual(run_task(ship, intent).outcome.kind, "committed")
        self.assertEqual(run_task(ship, intent).outcome.kind, "duplicate")
        self.assertEqual(Order.objects.get(pk=order.pk).version, 2)

    def test_a_task_decided_before_a_save_is_stale(self):
        order = Order.objects.create(status="paid")
        intent = order.intent("ship")
        order.status = "cancelled"
        order.save()
        self.assertEqual(run_task(ship, intent).outcome.kind, "stale")
        self.assertEqual(Order.objects.get(pk=order.pk).status, "cancelled")


class CeleryEager(FencedTasksMixin, TestCase):
    def test_celery_apply_commits_on_the_test_connection(self):
        order = Order.objects.create(status="paid")
        result = ship.apply(args=(ship.fencing.encode(order.intent("ship")),))
        self.assertEqual(result.get()["outcome"], "committed")
        self.assertEqual(Order.objects.get(pk=order.pk).status, "shipped")
