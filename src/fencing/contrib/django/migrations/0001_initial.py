"""fencing's own tables, made by ``manage.py migrate`` (and dropped by
``manage.py migrate fencing zero``)."""

from typing import Any, ClassVar

from django.db import migrations

from fencing.contrib.django.operations import CreateFencingTables


class Migration(migrations.Migration):  # type: ignore[misc]
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [CreateFencingTables()]
