#!/usr/bin/env python
"""Django's command-line utility; starts the embedded engines when no DATABASE_URL / REDIS_URL is set."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "elicit_hub.settings")
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        from elicit_hub import engines

        engines.start()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
