"""How the daemon's log lines are written.

Hygiene: values from outside (node ids, message ids, peers' answers, paths) are written with
their control characters escaped, so no value can forge a log line or hide in one.
`EscapeControlCharacters` is a logging filter the daemon puts on its log handlers
(`gunicorn_conf.py`), so every logged value is escaped in one place, whoever logs it.

Cost: request threads do not write their lines. They hand each record to `LogWriter`, one
thread that wakes at most every `GATHER_SECS` and writes what has gathered. A line per job is
logged (created, claimed, finished), so a thread woken per line would be woken a thousand
times a second, each time taking the interpreter lock from the request threads; gathered, a
line costs the request thread one queue append.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
import time
from collections.abc import Sequence

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(value: object) -> str:
    """`value` as text with every control character escaped (`\\n`, `\\x1b`, …)."""
    text = str(value)
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class EscapeControlCharacters(logging.Filter):
    """Escape control characters in a record's arguments (the values, not the format)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(
            isinstance(arg, str) and _CONTROL.search(arg) for arg in args
        ):
            record.args = tuple(printable(arg) if isinstance(arg, str) else arg for arg in args)
        return True


GATHER_SECS = 0.05
"""The log writer sleeps this long after its first record before writing what has gathered:
lines reach the log at most this late, and the thread wakes at most 20 times a second."""


class LogWriter:
    """One thread writing the records handed to `queue` through `handlers` (each at its own
    level), a gathered batch at a time, in the order they were logged."""

    def __init__(
        self,
        records: queue.SimpleQueue[logging.LogRecord | None],
        handlers: Sequence[logging.Handler],
    ) -> None:
        self.queue = records
        self._handlers = tuple(handlers)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write every record queued so far, then end the thread."""
        if self._thread is not None:
            self.queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        records = self.queue
        while True:
            batch = [records.get()]  # idle: sleeps until a line comes
            time.sleep(GATHER_SECS)
            while True:
                try:
                    batch.append(records.get_nowait())
                except queue.Empty:
                    break
            for record in batch:
                if record is None:
                    return
                self._write(record)

    def _write(self, record: logging.LogRecord) -> None:
        for handler in self._handlers:
            if record.levelno >= handler.level:
                handler.handle(record)
