from django.db import migrations, models

import fencing.contrib.django.fields


class Migration(migrations.Migration):
    initial = True

    dependencies = [("fencing", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Parcel",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("version", fencing.contrib.django.fields.VersionField()),
                ("status", models.CharField(default="new", max_length=20)),
            ],
            options={
                "abstract": False,
            },
        ),
    ]
