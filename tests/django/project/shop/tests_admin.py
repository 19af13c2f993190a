"""fencing in Django's admin, through Django's test client: the change form of a
FencedModel (shop/admin.py registers Order with FencedModelAdmin), the recorded
effects that need reconciling and the outbox."""

import re

from django.contrib import admin
from django.contrib.admin import AdminSite
from django.contrib.auth.models import Permission, User
from django.db.models.signals import pre_save
from django.test import TestCase, TransactionTestCase
from lines.models import Line

from fencing.contrib.django import signer, store
from fencing.contrib.django.admin import (
    FencedAdminMixin,
    FencedModelAdmin,
    check_fenced_admins,
)
from fencing.contrib.django.sites import FencedAdminSite

from .admin import OrderAdmin
from .jobs import ship
from .models import Order, Plain

CONFLICT = "was changed by someone else after you opened this page"


def admin_client(test):
    user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    test.client.force_login(user)


def shown(response, name="fencing_version"):
    """The value of the form's input ``name`` in a change page."""
    page = response.content.decode()
    found = re.search(rf'<input type="hidden" name="{name}" value="([^"]*)"', page)
    assert found is not None, page
    return found.group(1)


def change_url(order):
    return f"/admin/shop/order/{order.pk}/change/"


def form(token, **fields):
    data = {"status": "new", "fee": "0", "note": "", "fencing_version": token}
    data.update(fields)
    return data


class ChangeForm(TestCase):
    def setUp(self):
        admin_client(self)
        self.order = Order.objects.create(status="paid")

    def test_the_form_carries_the_version_hidden_and_signed_never_editable(self):
        page = self.client.get(change_url(self.order))
        self.assertEqual(page.status_code, 200)
        intent = signer().verify(shown(page))  # signed: FENCING["SIGNING_KEYS"] is set
        self.assertEqual((intent.collection, intent.key), ("shop.order", self.order.pk))
        self.assertEqual(intent.expected_version, 1)
        self.assertNotIn('name="version"', page.content.decode())

    def test_a_fresh_save_works_and_saving_again_works(self):
        token = shown(self.client.get(change_url(self.order)))
        done = self.client.post(change_url(self.order), form(token, status="packed"))
        self.assertEqual(done.status_code, 302)
        self.assertEqual(Order.objects.values_list("status", "version").get(), ("packed", 2))
        token = shown(self.client.get(change_url(self.order)))
        done = self.client.post(change_url(self.order), form(token, status="shipped", fee="3"))
        self.assertEqual(done.status_code, 302)
        self.assertEqual(
            Order.objects.values_list("status", "fee", "version").get(), ("shipped", 3, 3)
        )

    def test_a_stale_form_shows_the_conflict_and_the_current_values(self):
        token = shown(self.client.get(change_url(self.order)))  # the admin opens the page
        worker = Order.objects.get(pk=self.order.pk)
        worker.status, worker.note = "shipped", "tracking 42"
        worker.save()  # version 2: shipped meanwhile
        answer = self.client.post(change_url(self.order), form(token, status="paid", fee="5"))
        self.assertEqual(answer.status_code, 200)
        page = answer.content.decode()
        self.assertIn(CONFLICT, page)
        self.assertIn("you edited version 1, it is at version 2 now", page)
        self.assertIn("Status: shipped", page)
        self.assertIn("Note: tracking 42", page)
        self.assertIn("Not saved: the current value is shipped", page)
        self.assertEqual(
            Order.objects.values_list("status", "fee", "note", "version").get(),
            ("shipped", 0, "tracking 42", 2),
        )

    def test_the_same_page_posted_twice_is_stale_the_second_time(self):
        token = shown(self.client.get(change_url(self.order)))
        self.assertEqual(
            self.client.post(change_url(self.order), form(token, fee="1")).status_code, 302
        )
        again = self.client.post(change_url(self.order), form(token, fee="2"))
        self.assertEqual(again.status_code, 200)
        self.assertIn(CONFLICT, again.content.decode())
        self.assertEqual(Order.objects.values_list("fee", "version").get(), (1, 2))

    def test_a_tampered_or_missing_version_is_refused_and_nothing_written(self):
        Order.objects.filter(pk=self.order.pk).update(note="moved")  # version 2
        other = Order.objects.create()
        for token in ("2", "", shown(self.client.get(change_url(other))), "x" * 40):
            answer = self.client.post(change_url(self.order), form(token, fee="9", version="2"))
            self.assertEqual(answer.status_code, 200, token)
            self.assertIn("version is missing or was altered", answer.content.decode())
        self.assertEqual(Order.objects.values_list("fee", "version").get(pk=self.order.pk), (0, 2))

    def test_a_version_field_posted_is_ignored(self):
        token = shown(self.client.get(change_url(self.order)))
        done = self.client.post(change_url(self.order), form(token, version="99"))
        self.assertEqual(done.status_code, 302)
        self.assertEqual(Order.objects.get(pk=self.order.pk).version, 2)

    def test_a_row_moved_between_the_posts_load_and_its_save_is_no_server_error(self):
        token = shown(self.client.get(change_url(self.order)))
        raced = []

        def race(sender, instance, **kwargs):
            if not raced:  # once: another write lands after the admin loaded the row
                raced.append(Order.objects.filter(pk=instance.pk).update(note="raced"))

        pre_save.connect(race, sender=Order)
        try:
            done = self.client.post(change_url(self.order), form(token, status="packed"))
        finally:
            pre_save.disconnect(race, sender=Order)
        # The refused save rolled the admin's transaction back, the raced write in it
        # too; posted again, the form's version is current, and the save is made.
        self.assertEqual(raced, [1])
        self.assertEqual(done.status_code, 302)
        self.assertEqual(
            Order.objects.values_list("status", "note", "version").get(), ("packed", "", 2)
        )

    def test_an_admin_with_its_own_fieldsets_gets_the_version_field_too(self):
        url = f"/admin-fieldsets/shop/order/{self.order.pk}/change/"
        token = shown(self.client.get(url))
        self.assertEqual(self.client.post(url, form(token, fee="1")).status_code, 302)
        stale = self.client.post(url, form(token, fee="2"))
        self.assertEqual(stale.status_code, 200)
        self.assertIn(CONFLICT, stale.content.decode())
        self.assertEqual(Order.objects.values_list("fee", "version").get(), (1, 2))

    def test_a_user_who_may_only_view_sees_no_version_field(self):
        viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
        viewer.user_permissions.add(Permission.objects.get(codename="view_order"))
        self.client.force_login(viewer)
        page = self.client.get(change_url(self.order))
        self.assertEqual(page.status_code, 200)
        self.assertNotIn("fencing_version", page.content.decode())
        self.assertIn("paid", page.content.decode())

    def test_the_add_form_has_no_version_to_check(self):
        done = self.client.post("/admin/shop/order/add/", form("", status="new"))
        self.assertEqual(done.status_code, 302)
        self.assertEqual(Order.objects.count(), 2)


class ListEditable(TestCase):
    url = "/admin-fieldsets/shop/order/"

    def setUp(self):
        admin_client(self)
        self.order = Order.objects.create(status="paid")

    def shown(self):
        """The row's version token as the list page shows it (beside its primary key)."""
        return shown(self.client.get(self.url), "form-0-fencing_version")

    def post(self, fee, token=None):
        data = {
            "form-TOTAL_FORMS": "1",
            "form-INITIAL_FORMS": "1",
            "form-MIN_NUM_FORMS": "0",
            "form-MAX_NUM_FORMS": "1000",
            "form-0-id": str(self.order.pk),
            "form-0-fee": str(fee),
            "_save": "Save",
        }
        if token is not False:
            data["form-0-fencing_version"] = self.shown() if token is None else token
        return self.client.post(self.url, data, follow=True)

    def test_a_stale_list_edit_is_refused_with_the_current_values(self):
        token = self.shown()  # the list opened at version 1
        Order.objects.filter(pk=self.order.pk).update(fee=3)  # a worker, meanwhile
        answer = self.post(7, token)
        page = answer.content.decode()
        self.assertEqual(answer.status_code, 200)
        self.assertIn(CONFLICT, page)
        self.assertIn("Not saved: the current value is 3", page)
        self.assertEqual(Order.objects.values_list("fee", "version").get(), (3, 2))

    def test_a_list_posted_without_its_versions_is_refused(self):
        answer = self.post(7, token=False)
        self.assertIn("version is missing or was altered", answer.content.decode())
        self.assertEqual(Order.objects.values_list("fee", "version").get(), (0, 1))

    def test_a_list_saves(self):
        self.assertEqual(self.post(7).status_code, 200)
        self.assertEqual(Order.objects.values_list("fee", "version").get(), (7, 2))

    def test_a_row_moved_during_the_save_is_a_message_not_a_server_error(self):
        def race(sender, instance, **kwargs):
            Order.objects.filter(pk=instance.pk).update(note="raced")

        pre_save.connect(race, sender=Order)
        try:
            answer = self.post(7)
        finally:
            pre_save.disconnect(race, sender=Order)
        self.assertEqual(answer.status_code, 200)
        self.assertIn(
            "was changed by someone else while this list was saved", answer.content.decode()
        )
        self.assertEqual(
            Order.objects.values_list("fee", "note", "version").get(), (0, "", 1)
        )  # rolled back, the raced write in the admin's transaction too


class Delete(TestCase):
    def setUp(self):
        admin_client(self)
        self.order = Order.objects.create(status="paid")
        self.url = f"/admin/shop/order/{self.order.pk}/delete/"

    def test_a_fresh_delete_works(self):
        token = shown(self.client.get(self.url))
        answer = self.client.post(self.url, {"post": "yes", "fencing_version": token}, follow=True)
        self.assertEqual(answer.status_code, 200)
        self.assertFalse(Order.objects.exists())

    def test_a_stale_delete_is_refused_and_shows_the_conflict(self):
        token = shown(self.client.get(self.url))  # the confirmation page, at version 1
        Order.objects.filter(pk=self.order.pk).update(status="shipped")  # a worker
        answer = self.client.post(self.url, {"post": "yes", "fencing_version": token}, follow=True)
        page = answer.content.decode()
        self.assertEqual(answer.status_code, 200)
        self.assertIn("was changed by someone else after you opened the delete page", page)
        self.assertIn("you saw version 1, it is at version 2 now", page)
        self.assertIn('value="shipped"', page)  # the change page, its current values
        self.assertEqual(Order.objects.values_list("status", "version").get(), ("shipped", 2))

    def test_a_delete_without_its_version_is_refused(self):
        answer = self.client.post(self.url, {"post": "yes"}, follow=True)
        self.assertIn("version is missing or was altered", answer.content.decode())
        self.assertTrue(Order.objects.exists())


class Inlines(TestCase):
    def setUp(self):
        admin_client(self)
        self.order = Order.objects.create(status="paid")
        self.line = Line.objects.create(order=self.order, sku="tea", qty=1)
        self.url = f"/admin-inlines/shop/order/{self.order.pk}/change/"

    def post(self, page, qty):
        data = form(shown(page), status="packed")
        data.update(
            {
                "lines-TOTAL_FORMS": "1",
                "lines-INITIAL_FORMS": "1",
                "lines-MIN_NUM_FORMS": "0",
                "lines-MAX_NUM_FORMS": "1000",
                "lines-0-id": str(self.line.pk),
                "lines-0-order": str(self.order.pk),
                "lines-0-sku": "tea",
                "lines-0-qty": str(qty),
                "lines-0-fencing_version": shown(page, "lines-0-fencing_version"),
            }
        )
        return self.client.post(self.url, data)

    def test_a_stale_inline_row_is_shown_with_its_current_values_and_nothing_written(self):
        page = self.client.get(self.url)
        Line.objects.filter(pk=self.line.pk).update(qty=5)  # the line moved on meanwhile
        answer = self.post(page, qty=2)
        self.assertEqual(answer.status_code, 200)
        self.assertIn("This line was changed by someone else", answer.content.decode())
        self.assertIn("Qty: 5", answer.content.decode())
        self.assertEqual(Line.objects.values_list("qty", "version").get(), (5, 2))
        self.assertEqual(Order.objects.values_list("status", "version").get(), ("paid", 1))

    def test_a_fresh_inline_row_saves_and_again(self):
        self.assertEqual(self.post(self.client.get(self.url), qty=2).status_code, 302)
        self.assertEqual(Line.objects.values_list("qty", "version").get(), (2, 2))
        self.assertEqual(self.post(self.client.get(self.url), qty=3).status_code, 302)
        self.assertEqual(Line.objects.values_list("qty", "version").get(), (3, 3))


class AutomaticallyFenced(TestCase):
    def test_admin_site_is_a_fenced_site_and_a_plain_model_admin_is_fenced(self):
        self.assertIsInstance(admin.site, FencedAdminSite)  # FencedAdminConfig's default
        self.assertIsInstance(admin.site._registry[Order], FencedAdminMixin)
        self.assertIsInstance(admin.site._registry[Order], OrderAdmin)
        site = FencedAdminSite(name="other")
        site.register([Order, Plain])
        self.assertIsInstance(site._registry[Order], FencedAdminMixin)
        self.assertNotIsInstance(site._registry[Plain], FencedAdminMixin)
        site.unregister(Order)
        site.register(Order, list_per_page=10)  # options make a subclass, fenced too
        self.assertIsInstance(site._registry[Order], FencedAdminMixin)
        self.assertEqual(site._registry[Order].list_per_page, 10)


class Check(TestCase):
    def test_a_fenced_model_on_a_plain_model_admin_is_warned_about(self):
        self.assertEqual(check_fenced_admins(), [])  # every site of shop/admin.py is fenced
        site = AdminSite(name="plain")
        site.register(Order)
        site.register(Plain)  # not a FencedModel: nothing to say
        found = check_fenced_admins()
        self.assertEqual([(w.id, w.obj.model) for w in found], [("fencing_admin.W001", Order)])
        self.assertIn("'plain' with ModelAdmin", found[0].msg)
        site.unregister(Order)
        site.register(Order, FencedModelAdmin)
        self.assertEqual(check_fenced_admins(), [])


class Effects(TransactionTestCase):
    url = "/admin/fencing/effect/"

    def setUp(self):
        admin_client(self)

    def settled_effect(self):
        """An effect recorded for a charge whose intent went stale: it needs reconciling."""
        order = Order.objects.create(status="paid")
        orders = store().table(Order)
        charge = order.intent("charge")
        fx = orders.effect(charge, "charge-card")
        Order.objects.filter(pk=order.pk).update(status="cancelled")
        self.assertEqual(orders.commit(charge, {"status": "charged"}).kind, "stale")
        return fx.idempotency_key

    def test_the_list_shows_an_effect_to_reconcile_and_filters_it(self):
        key = self.settled_effect()
        page = self.client.get(self.url)
        self.assertEqual(page.status_code, 200)
        self.assertIn(key, page.content.decode())
        self.assertIn("charge-card", page.content.decode())
        self.assertNotIn(key, self.client.get(self.url + "?age=3600").content.decode())
        self.assertNotIn(key, self.client.get(self.url + "?state=pending").content.decode())

    def test_a_pending_effect_is_listed_under_pending(self):
        order = Order.objects.create(status="paid")
        fx = store().table(Order).effect(order.intent("charge"), "charge-card")
        pending = self.client.get(self.url + "?state=pending").content.decode()
        self.assertIn(fx.idempotency_key, pending)
        self.assertNotIn(fx.idempotency_key, self.client.get(self.url).content.decode())

    def test_mark_reconciled_is_idempotent(self):
        key = self.settled_effect()
        action = {"action": "mark_reconciled", "_selected_action": [key]}
        done = self.client.post(self.url, action, follow=True)
        self.assertEqual(done.status_code, 200)
        self.assertIn("Marked 1 effect(s) reconciled.", done.content.decode())
        self.assertTrue(store().get_effect(key).reconciled)
        self.assertNotIn(key, done.content.decode().split("Marked 1")[1])
        again = self.client.post(self.url, action, follow=True)
        self.assertIn("Marked 0 effect(s) reconciled (1 already were).", again.content.decode())
        self.assertTrue(store().get_effect(key).reconciled)

    def test_a_user_who_may_only_view_cannot_mark(self):
        key = self.settled_effect()
        viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
        viewer.user_permissions.add(Permission.objects.get(codename="view_effect"))
        self.client.force_login(viewer)
        self.assertIn(key, self.client.get(self.url).content.decode())
        refused = self.client.post(
            self.url, {"action": "mark_reconciled", "_selected_action": [key]}
        )
        self.assertEqual(refused.status_code, 403)
        self.assertFalse(store().get_effect(key).reconciled)


class Outbox(TransactionTestCase):
    url = "/admin/fencing/outboxrow/"

    def setUp(self):
        admin_client(self)
        self.order = Order.objects.create(status="paid")
        self.row = store().outbox.send(ship, self.order.intent("ship"))

    def bury(self):
        outbox = store().outbox
        claim = outbox.claim("admin-test", "celery", limit=1000, ttl=30)
        mine = [row for row in claim.rows if row.id == self.row.id]
        outbox.release(claim, [row for row in claim.rows if row.id != self.row.id])
        self.assertEqual(outbox.bury(claim, mine, "the broker refused it"), 1)

    def test_pending_and_dead_rows_are_listed(self):
        page = self.client.get(self.url).content.decode()
        self.assertIn(f"<td>{self.row.id}</td>", page)
        self.assertNotIn('name="action"', page)  # a pending row is not retried or dropped
        self.assertIn(self.row.task, page)
        self.assertNotIn(
            f"<td>{self.row.id}</td>", self.client.get(self.url + "?state=dead").content.decode()
        )
        self.bury()
        dead = self.client.get(self.url + "?state=dead").content.decode()
        self.assertIn(f"<td>{self.row.id}</td>", dead)
        self.assertIn("the broker refused it", dead)
        self.assertNotIn(f"<td>{self.row.id}</td>", self.client.get(self.url).content.decode())

    def test_retry_puts_a_dead_row_back_and_drop_deletes_it(self):
        self.bury()
        retry = {"action": "retry", "_selected_action": [str(self.row.id)]}
        done = self.client.post(self.url + "?state=dead", retry, follow=True)
        self.assertIn("1 dead outbox row(s) put back to pending.", done.content.decode())
        self.assertIn(self.row.id, [r.id for r in store().outbox.pending(limit=1000)])
        again = self.client.post(self.url + "?state=dead", retry, follow=True)
        self.assertIn("not dead", again.content.decode())  # all or none: nothing changed
        self.bury()
        drop = {"action": "drop", "_selected_action": [str(self.row.id)]}
        done = self.client.post(self.url + "?state=dead", drop, follow=True)
        self.assertIn("1 dead outbox row(s) dropped.", done.content.decode())
        outbox = store().outbox
        ids = [r.id for r in [*outbox.pending(limit=1000), *outbox.dead(limit=1000)]]
        self.assertNotIn(self.row.id, ids)
