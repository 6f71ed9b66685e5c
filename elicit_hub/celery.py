"""The Celery app: JSON only, late acks, redelivery when a worker dies, time limits (see settings)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "elicit_hub.settings")

app = Celery("elicit_hub")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
