from django.contrib import admin

from fencing.contrib.django.admin import FencedModelAdmin

from .models import Order


@admin.register(Order)
class OrderAdmin(FencedModelAdmin):
    list_display = ("id", "status", "fee", "version")
