"""``FencedAdminSite``: an admin site that fences every FencedModel registered on it.

A module of its own, free of registrations: ``FencedAdminConfig`` names it as Django's
default site, which Django imports while it sets ``admin.site`` up (a module that
registered on ``admin.site`` as it is imported would register on a site Django then
throws away).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin

__all__ = ["FencedAdminSite"]


class FencedAdminSite(admin.AdminSite):  # type: ignore[misc]
    """An ``AdminSite`` whose ``register()`` fences a FencedModel's admin: an admin
    class without :class:`~fencing.contrib.django.admin.FencedAdminMixin` (a plain
    ``ModelAdmin`` included) is registered as a subclass of it with the mixin first.
    Other models are registered as they are.
    ``fencing.contrib.django.adminapp.FencedAdminConfig`` makes it the default
    ``admin.site``."""

    def register(self, model_or_iterable: Any, admin_class: Any = None, **options: Any) -> None:
        from django.db.models.base import ModelBase

        from .admin import FencedAdminMixin
        from .models import version_field

        found = (
            [model_or_iterable] if isinstance(model_or_iterable, ModelBase) else model_or_iterable
        )
        for model in found:
            chosen = admin_class or admin.ModelAdmin
            if version_field(model) is not None and not issubclass(chosen, FencedAdminMixin):
                chosen = type(
                    chosen.__name__, (FencedAdminMixin, chosen), {"__module__": chosen.__module__}
                )
            super().register(model, chosen, **options)
