#!/usr/bin/env python
"""Django's command-line utility; starts the embedded engines when no DATABASE_URL / REDIS_URL is set."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "elicit_hub.settings")
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        import subprocess

        from elicit_hub import engines

        try:
            engines.start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            # One line, as `make run` says it: what failed and, in the message, what to do.
            sys.exit(f"manage.py: the embedded engines did not start: {exc}")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
