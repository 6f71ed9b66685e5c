from django.urls import path

from approvals import grant_views, views

app_name = "approvals"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("queue/list/", views.queue_list, name="queue_list"),
    path("queue/count/", views.queue_count, name="queue_count"),
    path("requests/<uuid:pk>/", views.request_detail, name="request"),
    path("requests/<uuid:pk>/state/", views.request_state, name="request_state"),
    path("requests/<uuid:pk>/respond/", views.respond, name="respond"),
    path("requests/<uuid:pk>/open/", views.open_url, name="open_url"),
    path("requests/<uuid:pk>/decide/", views.gate_decide, name="gate_decide"),
    path("requests/<uuid:pk>/extend/", views.extend, name="extend"),
    path("requests/<uuid:pk>/presence/", views.request_presence, name="presence"),
    path("calls/<uuid:pk>/", views.call_detail, name="call"),
    path("calls/<uuid:pk>/body/", views.call_body, name="call_body"),
    path("calls/<uuid:pk>/routing/", views.call_routing, name="call_routing"),
    path("recent/", views.recent, name="recent"),
    path("grants/", grant_views.grant_list, name="grants"),
    path("grants/<uuid:pk>/revoke/", grant_views.grant_revoke, name="grant_revoke"),
]
