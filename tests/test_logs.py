"""The daemon's log writing (`tiny_scheduler/logs.py`): the log's thread keeps every record, in
order, at each handler's level, and writes what is queued when stopped; values are escaped."""

from __future__ import annotations

import io
import logging
import queue

from helpers import wait_for

from tiny_scheduler.logs import EscapeControlCharacters, LogWriter


def handler_to(stream: io.StringIO, level: int = logging.NOTSET) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(EscapeControlCharacters())
    return handler


def record(level: int, message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("tiny_scheduler.test", level, __file__, 1, message, args, None)


def test_records_are_written_in_order_at_each_handlers_level() -> None:
    everything, warnings = io.StringIO(), io.StringIO()
    records: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
    writer = LogWriter(records, [handler_to(everything), handler_to(warnings, logging.WARNING)])
    writer.start()
    try:
        for n in range(200):
            records.put(record(logging.WARNING if n % 50 == 0 else logging.INFO, "line %d", n))
        wait_for(lambda: everything.getvalue().count("\n") == 200, message="200 lines")
    finally:
        writer.stop()
    assert everything.getvalue().splitlines() == [
        f"{'WARNING' if n % 50 == 0 else 'INFO'} line {n}" for n in range(200)
    ]
    assert warnings.getvalue().splitlines() == [f"WARNING line {n}" for n in (0, 50, 100, 150)]


def test_stop_writes_what_is_queued_and_ends_the_thread() -> None:
    stream = io.StringIO()
    records: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
    writer = LogWriter(records, [handler_to(stream)])
    writer.start()
    thread = writer._thread
    for n in range(5):
        records.put(record(logging.INFO, "queued %d", n))
    writer.stop()
    assert stream.getvalue().splitlines() == [f"INFO queued {n}" for n in range(5)]
    assert thread is not None and not thread.is_alive()


def test_values_from_outside_cannot_forge_a_line() -> None:
    stream = io.StringIO()
    records: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
    writer = LogWriter(records, [handler_to(stream)])
    writer.start()
    records.put(record(logging.INFO, "node %s", "n1\nERROR forged\x1b[31m"))
    writer.stop()
    assert stream.getvalue() == "INFO node n1\\nERROR forged\\x1b[31m\n"
