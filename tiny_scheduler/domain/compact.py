"""A finished job that set nothing but the fields every job sets, held as a tuple of those
(`Ended`) instead of a `Job`: what most of a long history is, in a third of the memory.

A `Job` has a slot for each of its 43 fields (about 380 bytes before its values); a finished
job of the common kind (a plain command, no queue, owner, resources, retries, hold, ...)
needs nine of them, and an `Ended` is a tuple of those nine (about 110 bytes). The start-up
load makes one for each such stored job (`storage.rows.jobs_from_packed` with `compact`), and
the job table keeps it as that (`state.job_map.JobMap`), handing out the full `Job` whenever
one is read (`Ended.job`). Every other field reads as its declared default on an `Ended`
too (class attributes made from the declaration), so the start-up's bulk counting can treat
both alike.

Tests: `tests/test_compact.py`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from .jobs import FINAL_STATUSES, Job, Status

_FIELDS = dataclasses.fields(Job)


class Ended(NamedTuple):
    """The fields of a finished job that every job sets; all others at their defaults."""

    seq: int
    node_id: str
    command: str
    status: Status
    retry_count: int
    exit_code: int | None
    created_at: int
    running_at: int | None
    finished_at: int | None

    def job(self) -> Job:
        """The job itself."""
        return Job(*_values(self))

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES


# The other fields read as their defaults (start-up counting reads queue, reason, owner, ...).
for _field in _FIELDS:
    if _field.name not in Ended._fields:
        setattr(Ended, _field.name, _field.default)

# Job's constructor arguments in order: an Ended's value where it has the field, else the
# default (positional: keywords would cost a listing of old jobs more than the rest of it).
_PLACES = tuple(
    (Ended._fields.index(f.name), None) if f.name in Ended._fields else (-1, f.default)
    for f in _FIELDS
)


def _values(ended: Ended) -> list[object]:
    return [ended[index] if index >= 0 else default for index, default in _PLACES]
