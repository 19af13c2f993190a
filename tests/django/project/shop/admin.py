from django.contrib import admin

from fencing.contrib.django.admin import FencedModelAdmin

from .models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    """A plain ModelAdmin: admin.site is a FencedAdminSite (settings: FencedAdminConfig),
    which registers it with FencedAdminMixin first."""

    list_display = ("id", "status", "fee", "version")


#: A plain AdminSite, whose Order admin is a FencedModelAdmin naming its fieldsets
#: (the version field is added to them).
fieldsets_site = admin.AdminSite(name="fieldsets")


@admin.register(Order, site=fieldsets_site)
class OrderFieldsetsAdmin(FencedModelAdmin):
    fieldsets = ((None, {"fields": ("status",)}), ("More", {"fields": (("fee", "note"),)}))
    list_display = ("id", "status", "fee")
    list_editable = ("fee",)


class LineInline(admin.TabularInline):
    """A plain inline: FencedModelAdmin gives a FencedModel's inline FencedInlineMixin."""

    from lines.models import Line as model

    extra = 0


#: A plain AdminSite whose Order admin has the order's lines inline.
inlines_site = admin.AdminSite(name="inlines")


@admin.register(Order, site=inlines_site)
class OrderInlinesAdmin(FencedModelAdmin):
    inlines = [LineInline]
