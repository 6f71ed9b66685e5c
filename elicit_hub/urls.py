from django.contrib import admin
from django.urls import include, path

from approvals.views import SignInView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", SignInView.as_view(), name="login"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include("approvals.api.urls")),
    path("audit/", include("approvals.audit.urls")),
    path("", include("approvals.urls")),
]

handler400 = "approvals.middleware.bad_request"
handler500 = "approvals.outage.server_error"
