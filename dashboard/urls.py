from __future__ import annotations

from django.urls import path

from dashboard import imports, views

app_name = "dashboard"

urlpatterns = [
    path("", views.index, name="index"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("usage/", views.usage, name="usage"),
    path("keys/", views.keys, name="keys"),
    path("keys/<uuid:key_id>/revoke/", views.revoke_key, name="revoke-key"),
    path("agents/", views.agents, name="agents"),
    path("agents/<uuid:agent_id>/delete/", views.delete_agent, name="delete-agent"),
    path("connections/", views.connections, name="connections"),
    path(
        "connections/<uuid:connection_id>/revoke/",
        views.revoke_connection,
        name="revoke-connection",
    ),
    path("memories/", views.memories, name="memories"),
    path("memories/<uuid:memory_id>/delete/", views.delete_memory, name="delete-memory"),
    path("memories/<uuid:memory_id>/restore/", views.restore_memory, name="restore-memory"),
    path("memories/<uuid:memory_id>/link/", views.link_memory, name="link-memory"),
    path("memories/<uuid:memory_id>/history/", views.memory_history, name="memory-history"),
    path("memories/<uuid:memory_id>/history/erase/", views.erase_history, name="erase-history"),
    path("memories/changes/", views.changes, name="changes"),
    path("memories/download/", views.download_memories, name="download-memories"),
    path("memories/import/", imports.upload_import, name="upload-import"),
    path("memories/imports/", imports.import_jobs, name="import-jobs"),
    path("plan/", views.plan, name="plan"),
    path("plan/checkout/", views.start_checkout, name="checkout"),
    path("plan/portal/", views.billing_portal, name="portal"),
    path("signup/", views.signup, name="signup"),
]
