"""The Django trial's blind writers under pytest-django (tests/django/test_audit.py runs
this with ``-p fencing.testing.pytest_plugin``): each refused by the strict guard, each
reported by the audit; fenced writes neither. The ``test_reported_*`` tests are meant
to FAIL, with the audit's report; every other test passes."""

import re

import pytest
from django.db import DatabaseError, transaction
from django.db.models import F

from audited.models import Box, Crate, Sack
from fencing import Committed
from fencing.contrib.django.models import table

STRICT = re.escape("fencing_guard_audited_crate: UPDATE refused by fencing (strict)")


def refused(write, match=STRICT):
    with pytest.raises(DatabaseError, match=match), transaction.atomic():
        write()


# -- the strict guard: each blind writer refused (no audit) ----------------------------------
@pytest.mark.django_db
def test_strict_refuses_each_blind_writer():
    crate = Crate.objects.create(status="new")
    stale = Crate.objects.get(pk=crate.pk)
    moved = Crate.objects.filter(pk=crate.pk).update(status="moved", version=F("version") + 1)
    assert moved == 1  # a write that moves the version passes
    stale.status = "stale"  # a full-row save of a stale instance: version 1 over 2
    refused(stale.save, match="never moves backwards")
    fresh = Crate.objects.get(pk=crate.pk)
    fresh.status = "blind"  # a full-row save of a fresh one: the version as it was
    refused(fresh.save)
    refused(lambda: fresh.save(update_fields=["status"]))
    refused(lambda: Crate.objects.filter(pk=crate.pk).update(status="qs"))
    assert Crate.objects.values_list("status", "version").get() == ("moved", 2)


# -- no refusal and no report on fenced writes -----------------------------------------------
@pytest.mark.django_db
@pytest.mark.fencing_audit("audited_crate")  # and Box: a model with a VersionField
def test_fenced_writes_are_neither_refused_nor_reported(fencing_audit):
    box = Box.objects.create(status="new")
    box.status = "saved"
    box.save()
    assert box.version == 2
    assert Box.objects.filter(pk=box.pk).update(status="qs") == 1  # FencedQuerySet: + 1
    box.refresh_from_db()
    out = table(Box).commit(box.intent("ship"), {"status": "shipped"})
    assert isinstance(out, Committed) and out.record.version == 4
    crate = Crate.objects.create()
    Crate.objects.filter(pk=crate.pk).update(status="moved", version=F("version") + 1)
    assert {"audited_crate", "audited_box"} <= set(fencing_audit.tables)
    assert fencing_audit.findings == []


# -- the audit: each blind writer reported (these tests must fail) ---------------------------
@pytest.mark.django_db
@pytest.mark.fencing_audit("audited_sack")
def test_reported_full_row_save_of_a_stale_instance():
    sack = Sack.objects.create(status="new")
    stale = Sack.objects.get(pk=sack.pk)
    Sack.objects.filter(pk=sack.pk).update(status="moved", version=F("version") + 1)
    stale.status = "stale"
    stale.save()  # no guard here: it lands, and sets the version back


@pytest.mark.django_db
@pytest.mark.fencing_audit("audited_sack")
def test_reported_queryset_update():
    sack = Sack.objects.create(status="new")
    Sack.objects.filter(pk=sack.pk).update(status="qs")


@pytest.mark.django_db
@pytest.mark.fencing_audit("audited_sack")
def test_reported_save_of_some_fields():
    sack = Sack.objects.create(status="new")
    sack.status = "some"
    sack.save(update_fields=["status"])


@pytest.mark.django_db
@pytest.mark.fencing_audit("audited_crate")
def test_reported_and_refused():
    crate = Crate.objects.create(status="new")
    refused(lambda: Crate.objects.filter(pk=crate.pk).update(status="qs"))


# -- allow="fencing": only fencing's own commits may write the table -----------------------
@pytest.mark.django_db
@pytest.mark.fencing_audit("audited_box", allow="fencing")
def test_a_fenced_commit_is_not_reported_with_allow_fencing():
    box = Box.objects.create(status="new")
    out = table(Box).commit(box.intent("ship"), {"status": "shipped"})
    assert isinstance(out, Committed) and out.record.version == 2


@pytest.mark.django_db
@pytest.mark.fencing_audit("audited_box", allow="fencing")
def test_reported_outside_fencing():
    box = Box.objects.create(status="new")
    box.status = "saved"
    box.save()  # moves the version, but not through fencing's commit
