"""The installed version of tiny-scheduler, in one place: the daemon's banner, `GET /health`,
the `tiny_scheduler_build_info` metric and the command line's `version` all say the same.

Standard library only: the command line imports this too.
"""

from __future__ import annotations

import functools
import importlib.metadata

PACKAGE = "tiny-scheduler"


@functools.cache
def version() -> str:
    """The installed package's version ("unknown" when run from files nobody installed).

    Cached: the metadata is read from disk, and `/health` may be polled many times a second.
    """
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
