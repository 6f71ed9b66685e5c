from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from approvals.views import SignInView

# Of Django's account pages, those the hub uses. Not its password reset: nothing links to it, anyone could
# make the hub mail any user's address as often as they liked, and its link named whatever host the request
# did. An administrator sets a forgotten password (the admin, or `manage.py changepassword`).
accounts = [
    path("login/", SignInView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password_change/", auth_views.PasswordChangeView.as_view(), name="password_change"),
    path("password_change/done/", auth_views.PasswordChangeDoneView.as_view(), name="password_change_done"),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include(accounts)),
    path("api/v1/", include("approvals.api.urls")),
    path("audit/", include("approvals.audit.urls")),
    path("", include("approvals.urls")),
]

handler400 = "approvals.middleware.bad_request"
handler500 = "approvals.outage.server_error"
