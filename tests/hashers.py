"""A password hasher for the suite's own process (tests/settings.py)."""

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class FewRoundsPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Django's PBKDF2 (``pbkdf2_sha256``) at a thousand rounds instead of a million: the same hash format,
    which any hub process verifies."""

    iterations = 1_000
