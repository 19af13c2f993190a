"""``FencedModel``: a model whose ``save()`` cannot overwrite newer state.

Every save is ``UPDATE ... SET ..., version = version + 1 WHERE pk = %s AND version = %s``
(Django's ``Model._do_update`` is where it is made conditional, as django-concurrency
does): an instance loaded before the row moved on (a fenced commit of a worker, another
request's save, ``QuerySet.update()``) is refused with :class:`StaleSave` and nothing is
written. A successful save moves the instance's version on, so saving twice works.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from django.db import connections, models, router, transaction
from django.db.models import F

from fencing import Intent, Table

from .errors import StaleSave
from .fields import VersionField
from .stores import store

__all__ = ["FencedManager", "FencedModel", "FencedQuerySet", "table", "version_field"]


def version_field(model: Any) -> Any:
    """The model's :class:`VersionField` (``None`` if it has none)."""
    for field in model._meta.concrete_fields:
        if getattr(field, "fencing_version", False):
            return field
    return None


def table(model: Any, using: str | None = None) -> Table:
    """``model``'s table through Django's connection ``using`` (default: the model's
    database for writes): its reads and commits are part of Django's transaction
    (``transaction.atomic()``) when there is one."""
    alias = using or router.db_for_write(model)
    return store(alias).using(connections[alias]).table(model)


class FencedQuerySet(models.QuerySet):  # type: ignore[misc]
    """``update()`` moves the version on (``version = version + 1``) unless it sets the
    version itself; ``bulk_update()`` refuses stale objects (all or nothing) and moves
    their versions on."""

    def update(self, **kwargs: Any) -> int:
        field = version_field(self.model)
        if field is not None and field.name not in kwargs and field.attname not in kwargs:
            kwargs[field.attname] = F(field.attname) + 1
        updated: int = super().update(**kwargs)
        return updated

    update.alters_data = True  # type: ignore[attr-defined]

    def bulk_update(
        self, objs: Iterable[Any], fields: Iterable[str], batch_size: int | None = None
    ) -> int:
        field = version_field(self.model)
        objs = list(objs)
        if field is None or not objs:
            done: int = super().bulk_update(objs, fields, batch_size=batch_size)
            return done
        fields = [name for name in fields if name not in (field.name, field.attname)]
        with transaction.atomic(using=self.db):
            rows = self.filter(pk__in=[obj.pk for obj in objs]).select_for_update()
            now = dict(rows.values_list("pk", field.attname))
            for obj in objs:
                if now.get(obj.pk) != getattr(obj, field.attname):
                    current = self.model._base_manager.using(self.db).filter(pk=obj.pk).first()
                    raise StaleSave(obj, getattr(obj, field.attname), current, now.get(obj.pk))
            done = super().bulk_update(objs, fields, batch_size=batch_size)
        for obj in objs:
            setattr(obj, field.attname, getattr(obj, field.attname) + 1)
        return done

    bulk_update.alters_data = True  # type: ignore[attr-defined]


class FencedManager(models.Manager.from_queryset(FencedQuerySet)):  # type: ignore[misc]
    """The default manager of a :class:`FencedModel`."""


class FencedModel(models.Model):  # type: ignore[misc]
    """An abstract model with a ``version`` (:class:`VersionField`) whose ``save()`` of a
    stale instance raises :class:`StaleSave`; ``objects`` is a :class:`FencedManager`."""

    version = VersionField()
    objects: ClassVar[Any] = FencedManager()

    class Meta:
        abstract = True

    def save_base(
        self,
        raw: bool = False,
        force_insert: Any = False,
        force_update: bool = False,
        using: str | None = None,
        update_fields: Iterable[str] | None = None,
    ) -> None:
        using = using or router.db_for_write(type(self), instance=self)
        connection = transaction.get_connection(using)
        needs_rollback = connection.needs_rollback
        self._fencing_raw = raw
        try:
            super().save_base(
                raw=raw,
                force_insert=force_insert,
                force_update=force_update,
                using=using,
                update_fields=update_fields,
            )
        except StaleSave:
            # Nothing failed in the transaction (an UPDATE matched no row): Django's
            # mark_for_rollback_on_error need not make it unusable. A parent table
            # (multi-table inheritance) may have been written, so there it stays marked.
            if not self._meta.parents:
                connection.needs_rollback = needs_rollback
            raise
        finally:
            del self._fencing_raw

    save_base.alters_data = True  # type: ignore[attr-defined]

    def _do_update(
        self,
        base_qs: Any,
        using: str,
        pk_val: Any,
        values: list[tuple[Any, Any, Any]],
        update_fields: Any,
        forced_update: Any,
    ) -> bool:
        field = version_field(type(self))
        local = field is not None and field in base_qs.model._meta.local_concrete_fields
        if not local or getattr(self, "_fencing_raw", False):  # loaddata writes as it is
            done: bool = super()._do_update(
                base_qs, using, pk_val, values, update_fields, forced_update
            )
            return done
        if self._state.adding and not forced_update:
            return False  # a new instance is inserted (an existing row is not overwritten)
        if field.attname in self.get_deferred_fields():
            raise ValueError(
                f"{type(self).__name__}.{field.name} is deferred: load it (.only() and"
                " .defer() must keep it) so save() can tell whether the row moved on"
            )
        expected = getattr(self, field.attname)
        values = [value for value in values if value[0] is not field]
        values.append((field, None, F(field.attname) + 1))
        matched = base_qs.filter(pk=pk_val, **{field.attname: expected})._update(values)
        if matched:
            setattr(self, field.attname, expected + 1)
            return True
        current = base_qs.filter(pk=pk_val).first()
        now = None if current is None else getattr(current, field.attname)
        raise StaleSave(self, expected, current, now)

    def delete(self, using: str | None = None, keep_parents: bool = False) -> Any:
        """Delete the row only if it is still at this instance's version: a stale
        instance is refused with :class:`StaleSave` (its ``current``: the row now), and
        nothing is deleted. The check and the delete are one transaction: the row is
        locked by the check (``UPDATE ... SET version = version WHERE pk = %s AND
        version = %s``) until it is deleted. ``QuerySet.delete()`` is not checked."""
        field = version_field(type(self))
        if field is None or self.pk is None or self._state.adding:
            done: Any = super().delete(using=using, keep_parents=keep_parents)
            return done
        if field.attname in self.get_deferred_fields():
            raise ValueError(
                f"{type(self).__name__}.{field.name} is deferred: load it (.only() and"
                " .defer() must keep it) so delete() can tell whether the row moved on"
            )
        using = using or router.db_for_write(type(self), instance=self)
        expected = getattr(self, field.attname)
        rows = type(self)._base_manager.using(using)
        with transaction.atomic(using=using):
            mine = rows.filter(pk=self.pk, **{field.attname: expected})
            if mine.update(**{field.attname: F(field.attname)}):
                return super().delete(using=using, keep_parents=keep_parents)
        current = rows.filter(pk=self.pk).first()
        now = None if current is None else getattr(current, field.attname)
        raise StaleSave(self, expected, current, now)

    delete.alters_data = True  # type: ignore[attr-defined]

    @classmethod
    def __fencing_target__(cls) -> Table:
        """What a fenced task's ``target=Order`` commits to: ``store(alias).table(Order)``
        on the model's database for writes, asked at every run (so it follows Django's
        test database, and a forked worker opens its own store)."""
        return store(router.db_for_write(cls)).table(cls)

    def intent(
        self, transition: str, *, guard: Mapping[str, Any] | None = None, using: str | None = None
    ) -> Intent:
        """An intent to apply ``transition`` to this row at this instance's version, read
        through Django's connection (inside your ``transaction.atomic()``, your own
        uncommitted save included). Raises :class:`StaleSave` if the row moved on since
        this instance was loaded: a decision made on it would be stale already."""
        if self._state.adding or self.pk is None:
            raise ValueError(f"save the {type(self).__name__} before deciding about it")
        alias = using or self._state.db or router.db_for_write(type(self), instance=self)
        record = table(type(self), alias).get(self.pk)
        field = version_field(type(self))
        mine = getattr(self, field.attname)
        if record is None or record.version != mine:
            current = type(self)._base_manager.using(alias).filter(pk=self.pk).first()
            raise StaleSave(self, mine, current, None if record is None else record.version)
        return record.intent(transition, guard=guard)


# The admin's entries for fencing's effects and outbox (models without a table).
from .entries import Effect, OutboxRow  # noqa: E402, F401
