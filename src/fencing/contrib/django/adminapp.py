"""Django's admin with a site that fences every FencedModel registered on it.

``INSTALLED_APPS = [..., "fencing.contrib.django.adminapp.FencedAdminConfig", ...]`` in
place of ``"django.contrib.admin"``: ``admin.site`` is then a
:class:`~fencing.contrib.django.sites.FencedAdminSite`, so ``admin.site.register(Order)``
(a plain ``ModelAdmin``, or any admin class) gives the change form of a FencedModel the
version it showed, as :class:`~fencing.contrib.django.admin.FencedModelAdmin` does.
This is Django's own way to change the default site (``AdminConfig.default_site``).
"""

from __future__ import annotations

from django.contrib.admin.apps import AdminConfig

__all__ = ["FencedAdminConfig"]


class FencedAdminConfig(AdminConfig):  # type: ignore[misc]
    """Django's ``AdminConfig`` (autodiscovery included) whose default site is a
    :class:`~fencing.contrib.django.sites.FencedAdminSite`."""

    default = False
    default_site = "fencing.contrib.django.sites.FencedAdminSite"
