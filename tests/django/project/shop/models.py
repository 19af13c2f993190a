from django.db import models

from fencing.contrib.django.models import FencedModel


class Order(FencedModel):
    status = models.CharField(max_length=20, default="new")
    fee = models.IntegerField(default=0)
    note = models.CharField(max_length=100, blank=True, default="")


class Audit(models.Model):
    note = models.CharField(max_length=100)


class Plain(models.Model):
    """The naive baseline: the same columns, saved the way Django saves by default."""

    status = models.CharField(max_length=20, default="new")
    fee = models.IntegerField(default=0)
    version = models.BigIntegerField(default=1)
