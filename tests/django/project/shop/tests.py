"""The Django side of fencing, run by ``manage.py test`` on each database
(tests/django/test_django.py runs it on SQLite, PostgreSQL and MariaDB)."""

import os
import signal
import threading
import warnings

from django.db import DatabaseError, connection, connections, transaction
from django.forms import modelform_factory
from django.test import TransactionTestCase

import fencing
from fencing.contrib.django import (
    StaleSave,
    database_url,
    fenced_commit,
    signer,
    store,
    table,
)

from .models import Audit, Order, Plain


class Saves(TransactionTestCase):
    def test_create_sets_version_1_and_saving_twice_works(self):
        order = Order.objects.create(status="new")
        self.assertEqual(order.version, 1)
        order.status = "paid"
        order.save()
        order.status = "packed"
        order.save()
        self.assertEqual(order.version, 3)
        self.assertEqual(Order.objects.get(pk=order.pk).version, 3)
        self.assertEqual(Order.objects.get(pk=order.pk).status, "packed")

    def test_a_stale_save_is_refused_and_nothing_is_written(self):
        order = Order.objects.create(status="new")
        admin = Order.objects.get(pk=order.pk)
        other = Order.objects.get(pk=order.pk)
        other.status = "shipped"
        other.save()
        admin.status = "new"
        admin.note = "edited"
        with self.assertRaises(StaleSave) as refused:
            admin.save()
        error = refused.exception
        self.assertIsInstance(error, fencing.FencingError)
        self.assertIsInstance(error, DatabaseError)
        self.assertEqual((error.version, error.current_version), (1, 2))
        self.assertEqual(error.current.status, "shipped")
        self.assertIs(error.instance, admin)
        row = Order.objects.get(pk=order.pk)
        self.assertEqual((row.status, row.note, row.version), ("shipped", "", 2))
        self.assertEqual(admin.version, 1)  # not moved on: it is still the stale one

    def test_a_refused_save_leaves_the_transaction_usable(self):
        order = Order.objects.create()
        Order.objects.filter(pk=order.pk).update(status="moved")
        with transaction.atomic():
            Audit.objects.create(note="before")
            with self.assertRaises(StaleSave):
                order.save()
            Audit.objects.create(note="after")  # no TransactionManagementError
        self.assertEqual(sorted(Audit.objects.values_list("note", flat=True)), ["after", "before"])

    def test_a_deleted_row_is_not_saved_back(self):
        order = Order.objects.create()
        Order.objects.filter(pk=order.pk).delete()
        with self.assertRaises(StaleSave) as refused:
            order.save()
        self.assertIsNone(refused.exception.current)
        self.assertFalse(Order.objects.exists())

    def test_a_stale_delete_is_refused_with_the_current_row(self):
        order = Order.objects.create(status="paid")
        admin = Order.objects.get(pk=order.pk)
        order.status = "shipped"
        order.save()  # version 2
        with transaction.atomic():
            with self.assertRaises(StaleSave) as refused:
                admin.delete()  # loaded at version 1
            Audit.objects.create(note="the transaction goes on")
        self.assertEqual((refused.exception.version, refused.exception.current_version), (1, 2))
        self.assertEqual(refused.exception.current.status, "shipped")
        self.assertEqual(Order.objects.get().status, "shipped")  # nothing deleted
        self.assertEqual(Audit.objects.count(), 1)
        order.delete()  # the fresh instance is deleted
        self.assertFalse(Order.objects.exists())
        with self.assertRaises(StaleSave) as gone:
            admin.delete()
        self.assertIsNone(gone.exception.current)

    def test_a_new_instance_does_not_overwrite_an_existing_row(self):
        order = Order.objects.create(status="paid")
        with self.assertRaises(DatabaseError), transaction.atomic():
            Order(pk=order.pk, status="new").save()
        self.assertEqual(Order.objects.get(pk=order.pk).status, "paid")

    def test_update_fields_moves_the_version_and_is_checked(self):
        order = Order.objects.create()
        order.fee = 7
        order.save(update_fields=["fee"])
        self.assertEqual(order.version, 2)
        self.assertEqual(Order.objects.values_list("fee", "version").get(), (7, 2))
        stale = Order.objects.get(pk=order.pk)
        order.save(update_fields=["status"])
        stale.fee = 9
        with self.assertRaises(StaleSave):
            stale.save(update_fields=["fee"])
        self.assertEqual(Order.objects.values_list("fee", "version").get(), (7, 3))

    def test_queryset_update_moves_the_version(self):
        order = Order.objects.create()
        self.assertEqual(Order.objects.filter(pk=order.pk).update(status="paid"), 1)
        self.assertEqual(Order.objects.get(pk=order.pk).version, 2)
        order.status = "new"
        with self.assertRaises(StaleSave):
            order.save()  # loaded before the update()
        self.assertEqual(Order.objects.get(pk=order.pk).status, "paid")

    def test_bulk_update_moves_versions_and_refuses_stale_objects(self):
        one, two = Order.objects.create(), Order.objects.create()
        one.fee, two.fee = 1, 2
        Order.objects.bulk_update([one, two], ["fee"])
        self.assertEqual((one.version, two.version), (2, 2))
        self.assertEqual(sorted(Order.objects.values_list("fee", "version")), [(1, 2), (2, 2)])
        Order.objects.filter(pk=two.pk).update(note="moved")
        one.fee, two.fee = 10, 20
        with self.assertRaises(StaleSave) as refused:
            Order.objects.bulk_update([one, two], ["fee"])
        self.assertIs(refused.exception.instance, two)
        self.assertEqual(sorted(Order.objects.values_list("fee", flat=True)), [1, 2])  # neither

    def test_a_deferred_version_is_refused(self):
        order = Order.objects.create()
        loaded = Order.objects.only("status").get(pk=order.pk)
        loaded.status = "x"
        with self.assertRaises(ValueError):
            loaded.save()
        self.assertEqual(Order.objects.get(pk=order.pk).status, "new")

    def test_the_version_is_not_in_forms(self):
        form = modelform_factory(Order, fields="__all__")
        self.assertNotIn("version", form.base_fields)
        self.assertIn("status", form.base_fields)


class Fenced(TransactionTestCase):
    def test_store_table_takes_the_model(self):
        order = Order.objects.create(status="paid")
        orders = store().table(Order)
        intent = orders.intent(order.pk, "ship")
        self.assertEqual((intent.collection, intent.expected_version), ("shop_order", 1))
        outcome = orders.commit(intent, {"status": "shipped"})
        self.assertIsInstance(outcome, fencing.Committed)
        self.assertEqual(outcome.record.version, 2)
        self.assertEqual(Order.objects.values_list("status", "version").get(), ("shipped", 2))

    def test_the_issue_a_stale_admin_save_cannot_undo_a_fenced_commit(self):
        order = Order.objects.create(status="paid")
        cancel = order.intent("cancel")  # queued long ago, at version 1
        admin = Order.objects.get(pk=order.pk)  # the admin opens the page
        ship = order.intent("ship")
        self.assertIsInstance(
            store().table(Order).commit(ship, {"status": "shipped"}), fencing.Committed
        )
        admin.note = "called the customer"
        with self.assertRaises(StaleSave):
            admin.save()  # would put status back to "paid" and version 2 -> 1... no: 1 -> 2
        self.assertEqual(Order.objects.values_list("status", "version").get(), ("shipped", 2))
        outcome = store().table(Order).commit(cancel, {"status": "cancelled"})
        self.assertIsInstance(outcome, fencing.Stale)
        self.assertEqual(outcome.current.version, 2)
        self.assertEqual(Order.objects.get().status, "shipped")

    def test_an_intent_decided_before_an_admin_save_ends_stale(self):
        order = Order.objects.create(status="paid")
        cancel = order.intent("cancel")
        admin = Order.objects.get(pk=order.pk)
        admin.note = "gift wrap"
        admin.save()
        outcome = store().table(Order).commit(cancel, {"status": "cancelled"})
        self.assertIsInstance(outcome, fencing.Stale)
        self.assertEqual(Order.objects.values_list("status", "version").get(), ("paid", 2))

    def test_a_redelivered_fee_task_is_applied_once(self):
        order = Order.objects.create(fee=0)
        message = signer().sign(order.intent("add-fee"))

        def task(payload):  # what a worker runs, once per delivery
            intent = signer().verify(payload)
            return store().table(Order).apply(intent, lambda rec: {"fee": rec.state["fee"] + 5})

        first, again = task(message), task(message)
        self.assertIsInstance(first, fencing.Committed)
        self.assertIsInstance(again, fencing.Duplicate)
        self.assertEqual(Order.objects.values_list("fee", "version").get(), (5, 2))

    def test_intent_of_a_stale_instance_is_refused(self):
        order = Order.objects.create()
        Order.objects.filter(pk=order.pk).update(status="moved")
        with self.assertRaises(StaleSave):
            order.intent("ship")
        with self.assertRaises(ValueError):
            Order(status="unsaved").intent("ship")

    def test_fenced_commit_signal(self):
        order = Order.objects.create()
        seen = []

        def receiver(sender, **kwargs):
            seen.append((sender, kwargs["pk"], kwargs["version"], kwargs["using"]))

        fenced_commit.connect(receiver)
        try:
            intent, late = order.intent("pay"), order.intent("cancel")
            store().table(Order).commit(intent, {"status": "paid"})
            store().table(Order).commit(intent, {"status": "paid"})  # Duplicate: not sent
            store().table(Order).commit(late, {"status": "cancelled"})  # Stale: not sent
        finally:
            fenced_commit.disconnect(receiver)
        self.assertEqual(seen, [(Order, order.pk, 2, "default")])


class UsingDjangosConnection(TransactionTestCase):
    def test_every_spelling_of_the_connection(self):
        order = Order.objects.create()
        for given in (connection, connections["default"], connections[Order.objects.db]):
            connection.close()  # connection.connection is None until a query: still fine
            intent = store().using(given).table(Order).intent(order.pk, "look")
            self.assertEqual(intent.expected_version, Order.objects.get().version)
            store().using(given).table(Order).commit(intent, {"note": "looked"})
        self.assertEqual(Order.objects.get().version, 4)

    def test_a_fenced_commit_rolls_back_with_atomic(self):
        order = Order.objects.create(status="paid")
        intent = order.intent("ship")
        with self.assertRaises(RuntimeError), transaction.atomic():
            Audit.objects.create(note="shipping")
            outcome = table(Order).commit(intent, {"status": "shipped"})
            self.assertIsInstance(outcome, fencing.Committed)
            self.assertEqual(Order.objects.get().status, "shipped")  # seen inside
            raise RuntimeError("the request failed")
        self.assertEqual(Order.objects.values_list("status", "version").get(), ("paid", 1))
        self.assertFalse(Audit.objects.exists())
        # it never happened, so the same intent commits later (not Duplicate)
        self.assertIsInstance(
            store().table(Order).commit(intent, {"status": "shipped"}), fencing.Committed
        )

    def test_a_rolled_back_savepoint_takes_only_the_inner_part(self):
        one, two = Order.objects.create(), Order.objects.create()
        with transaction.atomic():
            table(Order).commit(one.intent("pay"), {"status": "paid"})
            try:
                with transaction.atomic():
                    table(Order).commit(two.intent("pay"), {"status": "paid"})
                    raise RuntimeError("inner")
            except RuntimeError:
                pass
            Audit.objects.create(note="outer")
        rows = dict(Order.objects.values_list("pk", "status"))
        self.assertEqual(rows, {one.pk: "paid", two.pk: "new"})
        self.assertEqual(Audit.objects.count(), 1)

    def test_intent_inside_atomic_sees_the_own_save(self):
        order = Order.objects.create(status="paid")
        with transaction.atomic():
            order.status = "packed"
            order.save()
            intent = order.intent("ship")  # the version this transaction will commit
            self.assertEqual(intent.expected_version, 2)
        outcome = store().table(Order).commit(intent, {"status": "shipped"})
        self.assertIsInstance(outcome, fencing.Committed)

    def test_a_refused_fenced_commit_leaves_the_transaction_usable(self):
        order = Order.objects.create()
        old = order.intent("pay")
        order.save()
        with transaction.atomic():
            outcome = table(Order).commit(old, {"status": "paid"})
            self.assertIsInstance(outcome, fencing.Stale)
            Audit.objects.create(note="after")
        self.assertEqual(Audit.objects.count(), 1)

    def test_the_stores_own_commit_behind_this_transactions_lock_never_waits_on_it(self):
        """The store's own connection must not wait for the row this thread's
        transaction saved (released only when that transaction ends). MariaDB (PyMySQL,
        mysqlclient): its locking read would wait, and is refused with SelfDeadlock at
        once (it waited innodb_lock_wait_timeout, and a task's retries waited again);
        PostgreSQL (psycopg 3, psycopg2): the commit judges the committed row, Stale."""
        if connection.vendor == "sqlite":
            self.skipTest("SQLite: one writer at a time (docs/transactions.md)")
        order = Order.objects.create()
        with transaction.atomic():
            order.status = "paid"
            order.save()  # this transaction's row lock
            intent = order.intent("ship")  # through Django's connection: this thread's
            try:
                outcome = store().table(Order).commit(intent, {"status": "shipped"})
            except fencing.SelfDeadlock:
                outcome = None
            if connection.vendor == "mysql":
                self.assertIsNone(outcome)
            else:
                self.assertIsInstance(outcome, fencing.Stale)
            Audit.objects.create(note="the transaction goes on")
        self.assertEqual(Order.objects.get().status, "paid")
        self.assertEqual(Audit.objects.count(), 1)

    def test_a_commit_in_another_thread_uses_that_threads_connection(self):
        order = Order.objects.create()
        intent = order.intent("pay")
        outcomes = []

        def worker():
            try:
                outcomes.append(table(Order).commit(intent, {"status": "paid"}))
            finally:
                connections.close_all()

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        self.assertIsInstance(outcomes[0], fencing.Committed)
        self.assertEqual(Order.objects.get().status, "paid")


class Stores(TransactionTestCase):
    def test_the_store_is_on_the_test_database(self):
        name = connection.settings_dict["NAME"]
        self.assertIn("test_fencing_django", str(name))
        self.assertIn(str(name).rsplit("/", 1)[-1], store().url)
        self.assertIs(store(), store())
        if connection.vendor == "postgresql":  # FENCING["OPTIONS"] reached fencing.open
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM information_schema.tables"
                    " WHERE table_schema = 'fencing' AND table_name LIKE 'fencing_%%'"
                )
                self.assertGreater(cursor.fetchone()[0], 0)

    def test_database_url_of_odd_settings(self):
        url = database_url("odd")
        self.assertEqual(
            url,
            "postgresql://ro%40t:p%40ss%3Aw%2Frd@/shop%20db"
            "?sslmode=disable&host=%2Fvar%2Frun%2Fpostgresql",
        )
        with self.assertRaises(fencing.ConfigurationError) as refused:
            database_url("memory")
        self.assertIn("TEST", str(refused.exception))


class Races(TransactionTestCase):
    """Workers that each loaded the row, then save their decision at the same moment."""

    WORKERS = 6

    def race(self, model):
        row = model.objects.create(status="new")
        loaded = [model.objects.get(pk=row.pk) for _ in range(self.WORKERS)]
        barrier = threading.Barrier(self.WORKERS)
        saved, refused, failed = [], [], []

        def worker(number, instance):
            try:
                instance.status = f"w{number}"
                instance.fee = instance.fee + 1  # read-modify-write on what it loaded
                barrier.wait()
                instance.save()
                saved.append(number)
            except StaleSave:
                refused.append(number)
            except Exception as exc:  # a lock error would be a failure of the test
                failed.append(exc)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=worker, args=each) for each in enumerate(loaded)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual(failed, [])
        return saved, refused, model.objects.get(pk=row.pk)

    def test_exactly_one_of_the_racing_saves_lands(self):
        saved, refused, row = self.race(Order)
        self.assertEqual(len(saved), 1, (saved, refused))
        self.assertEqual(len(refused), self.WORKERS - 1)
        self.assertEqual((row.status, row.fee, row.version), (f"w{saved[0]}", 1, 2))

    def test_the_naive_baseline_loses_updates(self):
        saved, _refused, row = self.race(Plain)
        self.assertEqual(len(saved), self.WORKERS)  # every save "succeeded"
        self.assertEqual(row.fee, 1)  # but only one increment is left: the others lost


class Forks(TransactionTestCase):
    def test_a_forked_child_opens_a_store_of_its_own(self):
        order = Order.objects.create()
        first, second = order.intent("pay"), order.intent("pack")
        parent = store()
        parent.table(Order).get(order.pk)  # the parent's store has a connection in use
        connections.close_all()  # (Django's own connections: as Celery's fixup does)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
            pid = os.fork()
        if pid == 0:  # the child: a prefork worker
            code = 1
            try:
                signal.alarm(30)
                mine = store()
                outcome = mine.table(Order).commit(first, {"status": "paid"})
                code = 0 if mine is not parent and outcome.committed else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertIs(store(), parent)  # the parent's store still works
        self.assertIsInstance(parent.table(Order).commit(second, {"note": "x"}), fencing.Stale)
        self.assertEqual(Order.objects.values_list("status", "version").get(), ("paid", 2))


class Async(TransactionTestCase):
    """An async view's spelling: Django's async ORM (asave, adelete: the same
    conditional writes), and fencing's sync API through sync_to_async (Django's
    connections are sync; its async ORM runs them in a thread the same way)."""

    async def test_asave_adelete_and_a_fenced_commit_from_async_code(self):
        from asgiref.sync import sync_to_async

        order = await Order.objects.acreate(status="paid")
        late = await Order.objects.aget(pk=order.pk)
        order.status = "shipped"
        await order.asave()
        late.status = "paid"
        with self.assertRaises(StaleSave):
            await late.asave()
        with self.assertRaises(StaleSave):
            await late.adelete()
        intent = await sync_to_async(order.intent)("pack")
        outcome = await sync_to_async(lambda: table(Order).commit(intent, {"status": "packed"}))()
        self.assertIsInstance(outcome, fencing.Committed)
        again = await sync_to_async(lambda: table(Order).commit(intent, {"status": "packed"}))()
        self.assertIsInstance(again, fencing.Duplicate)
        self.assertEqual((await Order.objects.aget(pk=order.pk)).version, 3)
