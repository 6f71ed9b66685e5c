"""Date-times between an HTML datetime-local input and RFC 3339.

A datetime-local input sends a wall-clock time with no zone ("2026-12-02T10:30"), while the
`date-time` format needs an offset. We never guess UTC: a reviewer in Tokyo typing 10:30
means 10:30 in Tokyo. The caller passes the reviewer's zone (IANA name or offset) as `tz`.
"""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ._common import _

_OFFSET = re.compile(r"([+-])(\d{2}):?(\d{2})")
_ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+\-/]{0,63}")
# Typed or posted date-time: a space is accepted for the T, seconds and the offset are optional.
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})?")


def resolve_tz(tz: str | None) -> tzinfo | None:
    """An IANA zone ("Europe/Paris"), an offset ("+01:00", "-0530") or "UTC"/"Z"; None if unknown."""
    text = (tz or "").strip()
    if text.upper() in ("Z", "UTC"):
        return UTC
    offset = _OFFSET.fullmatch(text)
    if offset:
        sign, hours, minutes = offset.group(1), int(offset.group(2)), int(offset.group(3))
        if hours > 23 or minutes > 59:
            return None
        delta = timedelta(hours=hours, minutes=minutes)
        return timezone(-delta if sign == "-" else delta)
    if not _ZONE_NAME.fullmatch(text):
        return None  # also keeps path-like input away from the zoneinfo file lookup
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def to_rfc3339(value: str, tz: str | None) -> tuple[str | None, str | None]:
    """(RFC 3339 text, None) or (None, message). Values with an offset keep it; others get `tz`."""
    text = value.strip().upper()  # "t" and "z" are allowed by RFC 3339; fromisoformat wants capitals
    if not _DATETIME.fullmatch(text):
        return None, _("Enter a date and time, like 2026-12-02 10:30")
    try:
        moment = datetime.fromisoformat(text.replace(" ", "T"))
    except ValueError:
        return None, _("Enter a real date and time")
    if moment.tzinfo is not None:
        return moment.isoformat(), None
    if not (tz or "").strip():
        return None, _("Choose a time zone")
    zone = resolve_tz(tz)
    if zone is None:
        return None, _("Unknown time zone")
    return _attach_zone(moment, zone, str(tz).strip())


def _attach_zone(local: datetime, zone: tzinfo, zone_name: str) -> tuple[str | None, str | None]:
    earlier, later = local.replace(tzinfo=zone, fold=0), local.replace(tzinfo=zone, fold=1)
    if earlier.utcoffset() != later.utcoffset():
        # A daylight-saving change: the wall-clock time is skipped or happens twice. Guessing
        # would shift the answer by an hour, so ask instead.
        round_trip = earlier.astimezone(UTC).astimezone(zone).replace(tzinfo=None)
        if round_trip != local:
            message = _("This time does not exist in %(zone)s (the clocks go forward)")
        else:
            message = _("This time happens twice in %(zone)s (the clocks go back); add the UTC offset")
        return None, message % {"zone": zone_name}
    offset = earlier.utcoffset() or timedelta(0)
    if offset.seconds % 60 or offset.microseconds:
        # A local mean time of old (Paris before 1911 was UTC+00:09:21): RFC 3339 has no seconds in an
        # offset, so the same instant is written in UTC.
        try:
            return earlier.astimezone(UTC).isoformat(), None
        except OverflowError:  # year 1 east of Greenwich: before the calendar's first UTC day
            return None, _("Enter a real date and time")
    return earlier.isoformat(), None


def offset_text(moment: datetime) -> str:
    offset = moment.utcoffset() or timedelta(0)
    sign = "-" if offset < timedelta(0) else "+"
    minutes = abs(int(offset.total_seconds())) // 60
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def split_datetime(value: str, tz: str | None) -> tuple[str, str]:
    """An RFC 3339 value as (datetime-local text, zone it is written in) for prefilling a form.

    In `tz` when it is known, else in the value's own offset, so that posting it back with
    that zone gives the same instant.
    """
    try:
        moment = datetime.fromisoformat(value.strip().upper())
    except ValueError:
        return value, ""  # e.g. a leap second: show the server's text untouched
    zone = resolve_tz(tz)
    zone_name = offset_text(moment) if moment.tzinfo is not None else ""
    if zone is not None and moment.tzinfo is not None:
        # Year 1 or 9999 moved past the calendar's edge cannot be shown there: it keeps its own offset.
        with contextlib.suppress(OverflowError):
            moment, zone_name = moment.astimezone(zone), str(tz).strip()
    local = moment.replace(tzinfo=None)
    if local.second == 0 and local.microsecond == 0:
        return local.isoformat(timespec="minutes"), zone_name
    if local.microsecond:
        # A datetime-local input takes at most three digits of a second and empties itself on more. Left as
        # shown, the field still sends the server's exact value (coercion compares it with this text).
        return local.isoformat(timespec="milliseconds"), zone_name
    return local.isoformat(), zone_name
