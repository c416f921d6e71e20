from __future__ import annotations

from django.urls import path

from accounts import api

app_name = "api"

urlpatterns = [
    path("keys", api.keys, name="keys"),
    path("keys/<str:key_id>", api.key, name="key"),
]
