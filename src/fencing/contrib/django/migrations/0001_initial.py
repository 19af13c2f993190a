"""fencing's own tables, made by ``manage.py migrate`` (and dropped by
``manage.py migrate fencing zero``)."""

from django.db import migrations

from fencing.contrib.django.operations import CreateFencingTables


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [CreateFencingTables()]
