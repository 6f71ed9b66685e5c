"""The test suite's settings: the hub's own, in development mode.

DEBUG is off unless DJANGO_DEBUG says otherwise; the suite runs the hub as `make run` does (loopback hosts,
http callbacks to loopback, this checkout's own secret key), and the processes it starts (a Celery worker,
Daphne) inherit the same environment.
"""

import os

os.environ["DJANGO_DEBUG"] = "true"

from elicit_hub.settings import *  # noqa: F403

# Each user the tests create hashes its password; Django's PBKDF2 (a million rounds) takes a good part of a
# second of CPU per user on a small machine. In the suite's process passwords hash with the same algorithm at
# a thousand rounds: a hash names its rounds, so the processes the suite starts (Daphne, the worker, on the
# hub's own settings) still verify it, and upgrade it as they would any older hash.
PASSWORD_HASHERS = ["tests.hashers.FewRoundsPBKDF2PasswordHasher"]
