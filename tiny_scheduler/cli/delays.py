"""`submit --at TIME` / `--in 10m`: the options and what they become in a job request
(`not_before`, `delay_secs`). A module of its own, so that `submit` only gains the two
options and one line.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?")


def delay_options(command: F) -> F:
    """`--at TIME` and `--in DURATION` for `submit` (passed as `at` and `delay`)."""
    command = click.option(
        "--in",
        "delay",
        metavar="DURATION",
        help="Hand the job to an agent only after this long: 90, 90s, 10m, 2h, 1d, 1h30m.",
    )(command)
    return click.option(
        "--at",
        "at",
        metavar="TIME",
        help="Hand the job to an agent only from this time: RFC 3339 (2026-11-30T03:00:00Z),"
        " or a date and time without an offset, taken as this machine's local time.",
    )(command)


def delay_fields(at: str | None, delay: str | None) -> dict[str, Any]:
    """The JobRequest fields for `--at` / `--in` (none when neither is given)."""
    if at is not None and delay is not None:
        raise click.UsageError("use --at or --in, not both")
    if at is not None:
        not_before = parse_at(at)
        now = datetime.datetime.now(datetime.timezone.utc)
        if not_before < now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"):
            # The API would take it and run the job at once: surely not what `--at` meant
            # (a date a year off, a local time read in another zone).
            raise click.BadParameter(
                f"{at!r} is in the past: it reads as {not_before} (UTC);"
                " leave --at out to run the job now",
                param_hint="'--at'",
            )
        return {"not_before": not_before}
    if delay is not None:
        return {"delay_secs": parse_duration(delay)}
    return {}


def parse_duration(text: str) -> int:
    """Seconds in `90`, `90s`, `10m`, `2h`, `1d`, `1h30m`; BadParameter otherwise."""
    found = _DURATION.fullmatch(text.strip())
    if not text.strip() or found is None:
        raise click.BadParameter(f"{text!r} is not a duration such as 90s, 10m, 2h or 1d")
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_at(text: str) -> str:
    """An RFC 3339 UTC time for `--at`: a time with an offset as given, one without taken as
    this machine's local time (what a person at this terminal means by `03:00`)."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a time such as 2026-11-30T03:00:00Z or '2026-11-30 03:00'"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # the local zone, daylight saving included
    utc = moment.astimezone(datetime.timezone.utc)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond:06d}Z"
