"""The job table's jobs by id, in id order, some held compact.

A `SortedDict` of seq -> `Job` in which a stored finished job of the common kind may be held
as its `domain.compact.Ended` (a third of the memory; the start-up load makes them). Every
read hands out the `Job` (`Ended.job()`, made afresh each time: nothing keeps it), so no
caller ever sees the difference (only `values()` and `items()`, which nothing uses, show
the stored form). The table's start-up counting reads the loaded list itself, where an
`Ended` reads like its `Job`. A job written later (`jobs[seq] = job`) is a `Job` again.

Tests: `tests/test_compact.py`.
"""

from __future__ import annotations

from typing import Any

from sortedcontainers import SortedDict

from ..domain.compact import Ended
from ..domain.jobs import Job

_MISSING: Any = object()


class JobMap(SortedDict):
    """seq -> Job, in seq order; values stored as `Job` or `Ended`, always read as `Job`."""

    def __getitem__(self, seq: int) -> Job:
        value = dict.__getitem__(self, seq)
        return value.job() if type(value) is Ended else value

    def get(self, seq: int, default: Any = None) -> Any:
        value = dict.get(self, seq, default)
        return value.job() if type(value) is Ended else value

    def pop(self, seq: int, default: Any = _MISSING) -> Any:
        value = super().pop(seq) if default is _MISSING else super().pop(seq, default)
        return value.job() if type(value) is Ended else value
