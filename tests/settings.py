"""The test suite's settings: the hub's own, in development mode.

DEBUG is off unless DJANGO_DEBUG says otherwise; the suite runs the hub as `make run` does (loopback hosts,
http callbacks to loopback, this checkout's own secret key), and the processes it starts (a Celery worker,
Daphne) inherit the same environment.
"""

import os

os.environ["DJANGO_DEBUG"] = "true"

from elicit_hub.settings import *  # noqa: F403
