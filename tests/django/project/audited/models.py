"""The Django trial's blind writers: ``Crate`` and ``Sack`` are plain models with a
version column (no ``FencedModel``): ``Crate``'s table carries the strict guard, ``Sack``'s
none (the audit alone finds its blind writers); ``Box`` is a ``FencedModel`` under the
strict guard (its saves move the version: nothing refused, nothing reported)."""

from django.db import models

from fencing.contrib.django.models import FencedModel


class Crate(models.Model):
    version = models.IntegerField(default=1)
    status = models.CharField(max_length=20, default="new")


class Sack(models.Model):
    version = models.IntegerField(default=1)
    status = models.CharField(max_length=20, default="new")


class Box(FencedModel):
    status = models.CharField(max_length=20, default="new")
