from django.db import migrations

import fencing.contrib.django.operations


class Migration(migrations.Migration):
    dependencies = [("guarded", "0001_initial")]

    operations = [fencing.contrib.django.operations.GuardTable("Parcel")]
