"""A fenced model whose table carries fencing's guard trigger (its migration 0002)."""

from django.db import models

from fencing.contrib.django.models import FencedModel


class Parcel(FencedModel):
    status = models.CharField(max_length=20, default="new")
