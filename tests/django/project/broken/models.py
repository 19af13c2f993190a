"""Deliberately broken for ``manage.py check`` (testproject/settings_broken.py only)."""

from django.db import models

from fencing.contrib.django.models import FencedModel


class Ledger(FencedModel):
    version = models.IntegerField(default=1)  # replaces the VersionField: fencing.W001
