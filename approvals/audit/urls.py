from django.urls import path, re_path

from approvals.audit import views as audit_views

app_name = "audit"

urlpatterns = [
    path("", audit_views.index, name="index"),
    path("newer/", audit_views.newer, name="newer"),
    path("calls/<uuid:call_id>/", audit_views.call_timeline, name="call_timeline"),
    re_path(r"^export\.(?P<fmt>csv|jsonl)$", audit_views.export, name="export"),
    path("head.json", audit_views.chain_head, name="chain_head"),
]
