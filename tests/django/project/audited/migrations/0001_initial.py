from django.db import migrations, models

import fencing.contrib.django.fields
import fencing.contrib.django.operations


def _id() -> models.BigAutoField:
    return models.BigAutoField(
        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
    )


class Migration(migrations.Migration):
    initial = True

    dependencies = [("fencing", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Crate",
            fields=[
                ("id", _id()),
                ("version", models.IntegerField(default=1)),
                ("status", models.CharField(default="new", max_length=20)),
            ],
        ),
        migrations.CreateModel(
            name="Sack",
            fields=[
                ("id", _id()),
                ("version", models.IntegerField(default=1)),
                ("status", models.CharField(default="new", max_length=20)),
            ],
        ),
        migrations.CreateModel(
            name="Box",
            fields=[
                ("id", _id()),
                ("version", fencing.contrib.django.fields.VersionField()),
                ("status", models.CharField(default="new", max_length=20)),
            ],
            options={"abstract": False},
        ),
        fencing.contrib.django.operations.GuardTable("Crate", version="version", mode="strict"),
        fencing.contrib.django.operations.GuardTable("Box", mode="strict"),
    ]
