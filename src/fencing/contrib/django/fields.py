"""``VersionField``: a row's version, moved on by every write and never edited by hand."""

from __future__ import annotations

from typing import Any

from django.db import models

__all__ = ["VersionField"]


class VersionField(models.BigIntegerField):  # type: ignore[misc]
    """The row's version: 1 when created, +1 at every save, ``update()``,
    ``bulk_update`` (of a :class:`~fencing.contrib.django.models.FencedModel`) and fenced
    commit. Not editable: forms and the admin never show or post it.

    ``store.table(Model)`` takes this field's column as the table's version column
    (fencing recognises it by ``fencing_version``)."""

    fencing_version = True
    description = "A fencing version (an integer moved on by every write)"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 1)
        kwargs.setdefault("editable", False)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        if kwargs.get("default") == 1:
            del kwargs["default"]
        if kwargs.get("editable") is False:
            del kwargs["editable"]
        return name, path, args, kwargs
