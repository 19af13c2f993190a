from django.contrib import admin

from fencing.contrib.django.admin import FencedModelAdmin

from .models import Order


@admin.register(Order)
class OrderAdmin(FencedModelAdmin):
    list_display = ("id", "status", "fee", "version")


#: A second site whose Order admin names its fieldsets (the version field is added).
fieldsets_site = admin.AdminSite(name="fieldsets")


@admin.register(Order, site=fieldsets_site)
class OrderFieldsetsAdmin(FencedModelAdmin):
    fieldsets = ((None, {"fields": ("status",)}), ("More", {"fields": (("fee", "note"),)}))
