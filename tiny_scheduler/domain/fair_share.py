"""Fair share: among due jobs of equal priority, the one whose owner has been allocated the
least recently goes first (Slurm's fair-share factor, in its simplest form).

A user's **usage** is the CPU time allocated to its jobs, `cpus` x wall seconds, running jobs
included, each second counted less the longer ago it was: it halves every `half_life_secs`
(`FAIRSHARE_HALF_LIFE_SECS`, an hour by default). So a user who ran a sweep an hour ago
weighs half as much as one running it now, and after a quiet day nobody's past counts. Jobs
without an owner (submitted with the shared key) count as one more user, "".

The order due jobs are handed out in (`order_key`): higher priority first, then the owner's
usage (lower first), then age (older first). With one owner (every job by the shared key, as
the tiny-aws tools submit) it is exactly priority-then-age, as before.

Pure: times and usages are handed in; `state.user_usage` keeps the running sums.

Tests: `tests/test_fair_share.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from .jobs import Job

US = 1_000_000


def rate(half_life_secs: float) -> float:
    """The decay rate per second of a half-life (ln 2 / half-life)."""
    return math.log(2) / half_life_secs


def decayed(value: float, elapsed_us: int, decay_rate: float) -> float:
    """What `value` (CPU seconds) counts for `elapsed_us` later."""
    if elapsed_us <= 0:
        return value
    return value * math.exp(-decay_rate * elapsed_us / US)


def charge(cpus: int, start_us: int, end_us: int, decay_rate: float) -> float:
    """The usage a job of `cpus` that ran from `start_us` to `end_us` counts for at `end_us`:
    each of its seconds decayed by how long before the end it was (the integral over its run
    of cpus * exp(-rate * (end - u)) du)."""
    seconds = max(0, end_us - start_us) / US
    if seconds == 0 or cpus <= 0:
        return 0.0
    return cpus * -math.expm1(-decay_rate * seconds) / decay_rate


def charged_at(cpus: int, runs: Iterable[tuple[int, int]], at_us: int, decay_rate: float) -> float:
    """What runs of `cpus` (start, end) count for at `at_us` (at or after every end): the
    sum of each one's `charge` `decayed` to `at_us`, in one pass (the start-up's, over every
    stored job)."""
    if cpus <= 0:
        return 0.0
    per_us = decay_rate / US
    exp, expm1 = math.exp, math.expm1
    total = math.fsum(
        -expm1(-per_us * (end - start)) * exp(-per_us * (at_us - end))
        for start, end in runs
        if end > start
    )
    return cpus * total / decay_rate


def order_key(usage: Mapping[str, float] | Callable[[str], float]) -> Callable[[Job], tuple]:
    """The key due jobs are handed out by: (-priority, the owner's usage, seq)."""
    look = usage if callable(usage) else (lambda owner: usage.get(owner, 0.0))

    def key(job: Job) -> tuple[int, float, int]:
        return (-job.priority, look(job.owner), job.seq)

    return key
