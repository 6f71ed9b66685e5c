"""What the hub's management commands share (the leading underscore keeps this module from being a command).

- An engine that does not answer is a one-line error and exit status ``ENGINE_DOWN``, not a traceback: an
  operator or a script can tell "try again once PostgreSQL / Redis is back" from a refused input (1).
- Text a server chose (its name, tool names, error messages) is printed as a terminal cannot obey: control
  characters (escape sequences that retitle, clear or recolour the terminal, a newline that forges another
  line of output) and invisible or direction-changing characters are shown as visible codes, as the
  dashboard shows them.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from approvals import outage

ENGINE_DOWN = 3

# C0 controls (newline and tab included: one value stays on one line), DEL, the C1 controls, and the
# characters the dashboard also shows as codes: bidi overrides and isolates, zero-width ones, the BOM.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)


def shown(text: object) -> str:
    """`text` as it may reach an operator's terminal or a log a script reads: each unsafe character as
    ``⟨U+001B⟩``."""
    return _UNSAFE.sub(lambda found: f"\u27e8U+{ord(found.group()):04X}\u27e9", str(text))


def port(value: str) -> int:
    """An argparse type: a TCP port a server can listen on (a server told 70000 would otherwise start on
    whatever the number wraps to, and say it listens on 70000)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value[:40]!r}") from None
    if not 0 < number < 65536:
        raise argparse.ArgumentTypeError(f"{number} is not a port (1 to 65535)")
    return number


def at_least_one(value: str) -> int:
    """An argparse type: a whole number of 1 or more."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value[:40]!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} is less than 1")
    return number


class HubCommand(BaseCommand):
    """A management command whose engine outages end it with a clear message and ``ENGINE_DOWN``."""

    def execute(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute(*args, **options)
        except Exception as exc:
            engine = outage.engine_of(exc)  # down, or refusing writes (MISCONF, a read-only PostgreSQL)
            if engine is None:
                raise
            what = "PostgreSQL (DATABASE_URL)" if engine == "postgresql" else "Redis (REDIS_URL)"
            # The class only: a driver's message may quote the address or a value.
            raise CommandError(
                f"{what} did not answer ({type(exc).__name__}); the command stopped. Start it, or check the "
                "setting, and run the command again.",
                returncode=ENGINE_DOWN,
            ) from None
