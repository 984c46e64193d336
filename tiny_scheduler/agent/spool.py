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

from .owner import write_atomically

log = logging.getLogger(__name__)

SUFFIX = ".report.json"


@dataclasses.dataclass(frozen=True)
class Report:
    """A final report: the PATCH body for one job, and what the claim said of the attempt
    (its `retry_count`, to tell a later attempt of the same job from this one)."""

    job_id: str
    body: dict[str, Any]
    retry_count: int | None = None
    folder: str | None = None  # the job's folder, removed once the report is settled


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
        data = json.dumps(dataclasses.asdict(report), separators=(",", ":")).encode()
        write_atomically(self.folder, os.path.basename(self._path(report.job_id)), data)

    def remove(self, job_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path(job_id))
            self._sync_folder()

    def has(self, job_id: str) -> bool:
        return os.path.exists(self._path(job_id))

    def entries(self) -> list[Report]:
        """Every stored report. A file that does not read as one, whatever is in it (which
        the atomic write should make impossible: a person's edit, a disk's fault), is set
        aside as `*.bad` with a warning and left for a person; nothing in it can stop the
        spool."""
        found = []
        for name in sorted(os.listdir(self.folder)):
            if not name.endswith(SUFFIX):
                continue
            path = os.path.join(self.folder, name)
            try:
                if os.path.getsize(path) > MAX_ENTRY_BYTES:
                    raise ValueError(f"over {MAX_ENTRY_BYTES} bytes")
                with open(path, "rb") as f:
                    found.append(_report_of(json.loads(f.read())))
            except FileNotFoundError:
                continue  # delivered meanwhile
            except Exception as exc:  # any shape at all: set aside, never fatal
                log.warning("spooled report %s is unreadable (%s); moved aside as .bad", path, exc)
                with contextlib.suppress(OSError):
                    os.replace(path, path + ".bad")
        return found

    def usage(self) -> tuple[int, int]:
        """(files, bytes) the reports take in the spool."""
        files = size = 0
        with contextlib.suppress(OSError), os.scandir(self.folder) as found:
            for entry in found:
                if entry.name.endswith(SUFFIX):
                    files += 1
                    with contextlib.suppress(OSError):
                        size += entry.stat().st_size
        return files, size

    def writable(self) -> str | None:
        """None when a file can be written to the spool now, else why not."""
        try:
            probe = os.path.join(self.folder, ".probe")
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, b"x" * 4096)  # a full disk refuses data, not always the create
                os.fsync(fd)
            finally:
                os.close(fd)
            os.remove(probe)
        except OSError as exc:
            return exc.strerror or str(exc)
        return None

    def _sync_folder(self) -> None:
        # The rename or removal is durable only once the directory itself is on disk.
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


MAX_ENTRY_BYTES = 64 * 1024 * 1024
"""A spool file larger than this is not a report this agent wrote (two output tails and a few
fields): set aside unread, so that it cannot take the agent's memory."""


def _report_of(raw: Any) -> Report:
    """A report from a spool file's JSON; ValueError when it is not of a report's shape."""
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    job_id, body = raw.get("job_id"), raw.get("body")
    retry_count, folder = raw.get("retry_count"), raw.get("folder")
    if not isinstance(job_id, str) or not job_id.startswith("job-"):
        raise ValueError("job_id is not a job id")
    if not isinstance(body, dict) or body.get("status") not in ("done", "failed"):
        raise ValueError("body is not a final report")
    if retry_count is not None and (
        isinstance(retry_count, bool) or not isinstance(retry_count, int)
    ):
        raise ValueError("retry_count is not a number")
    if folder is not None and not isinstance(folder, str):
        raise ValueError("folder is not a path")
    return Report(job_id, body, retry_count, folder)
