"""`--max-running N` or `--no-limit`: a limit of running jobs across the cluster, as `queue set`
and `user limit` both take it, checked once (exactly one of the two) and handed to the
command as `max_running` (None: no limit)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def limit_options(command: F) -> F:
    """The two options, resolved into one `max_running` argument (an int, or None)."""

    @functools.wraps(command)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        given, no_limit = kwargs.pop("given_max_running"), kwargs.pop("no_limit")
        if (given is None) == (not no_limit):
            raise click.UsageError("give --max-running N or --no-limit")
        return command(*args, max_running=None if no_limit else given, **kwargs)

    wrapped = click.option("--no-limit", is_flag=True, help="Remove the limit.")(wrapped)
    wrapped = click.option(
        "--max-running",
        "given_max_running",
        type=click.IntRange(min=1),
        help="Run at most this many of its jobs at once.",
    )(wrapped)
    return wrapped  # type: ignore[return-value]
