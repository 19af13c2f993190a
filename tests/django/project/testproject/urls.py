from django.contrib import admin
from django.urls import path
from shop.browser import stale_page

urlpatterns = [
    path("admin/", admin.site.urls),
    path("stale-page/", stale_page),  # shop/browser.py: 404 unless a test staged a post
]
