"""The test project under pytest-django (no custom runner, no fixture of fencing's
needed for the test database): run by tests/django/test_django.py."""

import pytest

from fencing.contrib.django.testing import run_task, tasks_on_test_connection
from shop.jobs import ship
from shop.models import Order


@pytest.fixture
def fenced_tasks():
    with tasks_on_test_connection():
        yield


@pytest.mark.django_db
def test_run_task_commits_inside_the_tests_transaction():
    order = Order.objects.create(status="paid")
    assert run_task(ship, order, "ship").outcome.kind == "committed"
    assert Order.objects.values_list("status", "version").get() == ("shipped", 2)


@pytest.mark.django_db
def test_celery_apply_in_the_fixture(fenced_tasks):
    order = Order.objects.create(status="paid")
    result = ship.apply(args=(ship.fencing.encode(order.intent("ship")),))
    assert result.get()["outcome"] == "committed"
    assert Order.objects.get(pk=order.pk).status == "shipped"


@pytest.mark.django_db(transaction=True)
def test_a_transactional_test_sees_the_commit_on_fencings_own_connection():
    order = Order.objects.create(status="paid")
    assert ship.fencing.run(ship.fencing.encode(order.intent("ship"))).outcome.kind == "committed"
    assert Order.objects.get(pk=order.pk).status == "shipped"
