"""The admin's conflict page in headless Chromium (run by tests/django/test_django.py:
``manage.py test shop.browser`` with ``FENCING_CHROMIUM`` and ``FENCING_DJANGO_SHOTS``
set; not a ``test*.py`` module, so ``manage.py test shop`` leaves it out).

The live server serves the admin; the browser opens ``/stale-page/``, which logs it in
and posts, from the browser, a change form opened before a worker shipped the order.
The page the browser then shows must say so, with the current values; its DOM and a
screenshot are written to ``FENCING_DJANGO_SHOTS``."""

import html
import os
import re
import subprocess
from pathlib import Path

from django.contrib.auth import login
from django.contrib.auth.models import User
from django.contrib.staticfiles.testing import StaticLiveServerTestCase
from django.http import Http404, HttpResponse
from django.middleware.csrf import get_token

from .models import Order

#: what /stale-page/ makes the browser post: {"url": ..., "data": {...}}
STAGED = {}


def stale_page(request):
    """Log the browser in as the admin and post the staged (stale) change form."""
    staged = STAGED.get("post")
    if staged is None:
        raise Http404("nothing staged")
    login(request, User.objects.get(username="admin"))
    fields = {**staged["data"], "csrfmiddlewaretoken": get_token(request)}
    inputs = "".join(
        f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
        for k, v in fields.items()
    )
    page = (
        f'<!doctype html><form method="post" action="{html.escape(staged["url"])}">{inputs}'
        "</form><script>document.forms[0].submit()</script>"
    )
    return HttpResponse(page)


class StaleAdminPage(StaticLiveServerTestCase):
    def chromium(self, *action):
        shots = Path(os.environ["FENCING_DJANGO_SHOTS"])
        profile = shots / f"profile-{len(list(shots.glob('profile-*')))}"
        done = subprocess.run(
            [
                os.environ["FENCING_CHROMIUM"],
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--window-size=1280,900",
                "--virtual-time-budget=15000",
                *action,
                f"{self.live_server_url}/stale-page/",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        return done.stdout

    def test_the_conflict_page_renders_the_message_and_the_current_values(self):
        User.objects.create_superuser("admin", "admin@example.com", "pw")
        self.client.force_login(User.objects.get(username="admin"))
        order = Order.objects.create(status="paid")
        url = f"/admin/shop/order/{order.pk}/change/"
        page = self.client.get(url).content.decode()
        token = re.search(r'name="fencing_version" value="([^"]*)"', page).group(1)
        Order.objects.filter(pk=order.pk).update(status="shipped", note="tracking 42")
        data = {"status": "cancelled", "fee": "0", "note": "", "fencing_version": token}
        STAGED["post"] = {"url": url, "data": data}
        try:
            dom = self.chromium("--dump-dom")
            shots = Path(os.environ["FENCING_DJANGO_SHOTS"])
            (shots / "conflict.html").write_text(dom)
            self.chromium(f"--screenshot={shots / 'conflict.png'}")
        finally:
            STAGED.clear()
        self.assertIn("was changed by someone else after you opened this page", dom)
        self.assertIn("Status: shipped", dom)
        self.assertIn("Note: tracking 42", dom)
        self.assertIn('class="errornote"', dom)
        self.assertEqual(
            Order.objects.values_list("status", "note", "version").get(),
            ("shipped", "tracking 42", 2),
        )
