"""Final reports kept on disk until a scheduler acknowledges them.

Each report is one JSON file named after its job, written to a temporary name, fsynced,
renamed into place and the directory fsynced, so that after a crash a report is either whole
or absent, never half written. A job has at most one report here: a new one for the same job
(a later attempt) replaces the old. `Spool.entries()` reads them back, which is how an agent
that starts again finds the reports its previous run could not deliver.

This module only stores; when and how often to send is the agent's business.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from typing import Any

log = logging.getLogger(__name__)

SUFFIX = ".report.json"


@dataclasses.dataclass(frozen=True)
class Report:
    """A final report: the PATCH body for one job, and what the claim said of the attempt
    (its `retry_count`, to tell a later attempt of the same job from this one)."""

    job_id: str
    body: dict[str, Any]
    retry_count: int | None = None


class Spool:
    """The reports in one directory (made when missing)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        os.makedirs(folder, exist_ok=True)

    def _path(self, job_id: str) -> str:
        # Job ids are `job-N`; anything else is kept out of the path all the same.
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job_id)
        return os.path.join(self.folder, safe + SUFFIX)

    def put(self, report: Report) -> None:
        """Store `report` durably (raises OSError when the disk refuses)."""
        path = self._path(report.job_id)
        data = json.dumps(dataclasses.asdict(report), separators=(",", ":")).encode()
        temporary = path + ".tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        self._sync_folder()

    def remove(self, job_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path(job_id))
            self._sync_folder()

    def has(self, job_id: str) -> bool:
        return os.path.exists(self._path(job_id))

    def entries(self) -> list[Report]:
        """Every stored report. A file that does not read as one (which the atomic write
        should make impossible) is set aside as `*.bad`, logged, and left for a person."""
        found = []
        for name in sorted(os.listdir(self.folder)):
            if not name.endswith(SUFFIX):
                continue
            path = os.path.join(self.folder, name)
            try:
                with open(path, "rb") as f:
                    raw = json.loads(f.read())
                found.append(Report(raw["job_id"], raw["body"], raw.get("retry_count")))
            except FileNotFoundError:
                continue  # delivered meanwhile
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.error("spooled report %s is unreadable (%s); moved aside", path, exc)
                with contextlib.suppress(OSError):
                    os.replace(path, path + ".bad")
        return found

    def _sync_folder(self) -> None:
        # The rename or removal is durable only once the directory itself is on disk.
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
