"""`tiny-scheduler submit` in a shell loop, without click: the plain forms of a submission are
read here, sent, and answered, and the process ends before click is ever imported (importing it
is most of a call's start-up: `for f in *.csv; do tiny-scheduler submit …; done` pays it on
every line).

`quick_submit` takes the command line's words and handles them only when they are a `submit`
(after `--url URL` at most) whose options are all in `OPTIONS`, each given once as click would
take it, with a value click would accept, and a command that follows them (after `--`, or
whose words start no option). Anything else (`--help`, `--wait`, another option, a value out
of range, an option after the command's first word, no command at all) gives None before
anything was sent, and click's `submit` runs instead, with its own errors and messages. What
is sent is `submission.job_body` of the same words, through the same `client.Client`; what is
printed is what click's `submit` prints for them.

Tests: `tests/test_cli_quick.py` (which also checks `OPTIONS` against click's declarations).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from ..domain.limits import MAX_JOB_RETRIES_ASKED, MAX_PRIORITY, MIN_PRIORITY
from .submission import env_pair, job_body

FLAG = "flag"
TEXT = "text"
PAIRS = "pairs"  # K=V, repeatable

OPTIONS: dict[str, tuple[str, object]] = {
    "-q": ("quiet", FLAG),
    "--quiet": ("quiet", FLAG),
    "-J": ("name", TEXT),
    "--name": ("name", TEXT),
    "--queue": ("queue", TEXT),
    "--idempotency-key": ("idempotency_key", TEXT),
    "--env": ("env", PAIRS),
    "--priority": ("priority", (MIN_PRIORITY, MAX_PRIORITY)),
    "--timeout": ("timeout_secs", (1, None)),
    "--retries": ("max_retries", (0, MAX_JOB_RETRIES_ASKED)),
}
"""The options a quick `submit` reads: each option's parameter name (as click's `submit` names
it) and its kind: a flag, a text, K=V pairs, or an integer within (lowest, highest)."""


def parse(args: Sequence[str]) -> dict[str, Any] | None:
    """The parameters of `submit ARGS` as click's `submit` would get them (only those given,
    and `command`), or None when these words are not a plain submission (see the module)."""
    found: dict[str, Any] = {}
    index = 0
    while index < len(args):
        word = args[index]
        if word == "--":
            found["command"] = tuple(args[index + 1 :])
            break
        if not word.startswith("-") or word == "-":
            rest = args[index:]
            if any(later.startswith("-") and later != "-" for later in rest):
                return None  # click takes options anywhere: let it say what these are
            found["command"] = tuple(rest)
            break
        name, equals, value = word.partition("=") if word.startswith("--") else (word, "", "")
        known = OPTIONS.get(name)
        if known is None:
            return None
        param, kind = known
        if kind == FLAG:
            if equals or param in found:
                return None
            found[param] = True
            index += 1
            continue
        if not equals:
            index += 1
            if index == len(args) or args[index].startswith("-"):
                return None
            value = args[index]
        taken = _value(kind, value)
        if taken is None:
            return None
        if kind == PAIRS:
            found.setdefault(param, []).append(taken)
        elif param in found:
            return None  # click keeps the last: rare enough to leave to it
        else:
            found[param] = taken
        index += 1
    if not found.get("command"):
        return None
    return found


def _value(kind: object, text: str) -> object | None:
    if kind == TEXT:
        return text
    if kind == PAIRS:
        return env_pair(text)
    assert isinstance(kind, tuple)
    low, high = kind
    if not text.isascii() or not text.isdigit():
        return None  # a sign, a space, a non-ASCII digit: click's own message says what
    number = int(text)
    if number < low or (high is not None and number > high):
        return None
    return number


def quick_submit(argv: Sequence[str]) -> int | None:
    """Run `tiny-scheduler ARGV` if it is a plain submission: its exit status; else None,
    with nothing sent and nothing printed."""
    url = os.environ.get("SCHEDULER_URL") or None  # click takes an empty variable as unset
    if argv[:1] == ["--url"] and len(argv) > 2:
        url, argv = argv[1], argv[2:]
    elif argv[:1] and argv[0].startswith("--url="):
        url, argv = argv[0].partition("=")[2], argv[1:]
    if argv[:1] != ["submit"]:
        return None
    given = parse(argv[1:])
    if given is None:
        return None
    from ..client import DEFAULT_URL, Client, ClientError, base_urls

    try:
        urls = ",".join(base_urls(url or DEFAULT_URL))
    except ValueError:
        return None  # click's `submit` says what is wrong with it
    env = dict(given.pop("env", ()))
    quiet = given.pop("quiet", False)
    key = given.pop("idempotency_key", None)
    body = job_body(given.pop("command"), env, **given)
    client = Client(urls, os.environ.get("TINYAWS_API_KEY") or None, plain=True)
    try:
        job = client.submit(body, key)
    except ClientError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    if quiet:
        print(job["job_id"])
    else:
        from ..display import job_line

        print(job_line(job))
    return 0
