from django.db import models

from fencing.contrib.django.models import FencedModel


class Line(FencedModel):
    """An order's line, fenced too: the admin's inline rows (shop/admin.py)."""

    order = models.ForeignKey("shop.Order", on_delete=models.CASCADE, related_name="lines")
    sku = models.CharField(max_length=20)
    qty = models.IntegerField(default=1)
