from django.contrib import admin
from django.urls import path
from shop.admin import fieldsets_site, inlines_site
from shop.browser import stale_page

urlpatterns = [
    path("admin/", admin.site.urls),
    path("admin-fieldsets/", fieldsets_site.urls),
    path("admin-inlines/", inlines_site.urls),
    path("stale-page/", stale_page),  # shop/browser.py: 404 unless a test staged a post
]
