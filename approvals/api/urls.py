from django.urls import path

from approvals.api.endpoints import api

urlpatterns = [path("", api.urls)]
