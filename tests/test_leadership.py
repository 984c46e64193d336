"""How a term that fails is logged: a term whose database went away under it (a terminated
backend, a server restarting, the job store refusing its load) is the election's business and
one line of the log; anything else is a bug and keeps its traceback. (Terminating PostgreSQL
backends once left 28 `elected term failed` tracebacks in the log.) The protocol itself runs
against real daemons and a real server in tests/test_ha.py."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

from tiny_scheduler.cluster.leadership import Leadership, expected_failure
from tiny_scheduler.errors import StoreError


class _Store:
    """What Leadership asks of its store while a term ends: nothing to fence or break here."""

    on_fenced: Any = None

    def fence_with(self, epoch: int | None) -> None:
        pass

    def interrupt(self) -> None:
        pass


def _store_failure() -> StoreError:
    try:
        try:
            raise psycopg.OperationalError("terminating connection due to administrator command")
        except psycopg.Error as exc:
            raise StoreError() from exc
    except StoreError as exc:
        return exc


def test_a_database_failure_is_one_line_naming_its_cause() -> None:
    line = expected_failure(_store_failure())
    assert line == (
        "job store unavailable, nothing was changed; try again: "
        "terminating connection due to administrator command"
    )
    assert expected_failure(psycopg.OperationalError("server closed the connection\nmore")) == (
        "server closed the connection"
    )
    assert expected_failure(ConnectionResetError(104, "Connection reset by peer"))


@pytest.mark.parametrize("bug", [KeyError("seq"), AttributeError("x"), ValueError("y")])
def test_anything_else_is_a_bug(bug: Exception) -> None:
    assert expected_failure(bug) is None


def run_one_term(failure: Exception, caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """A Leadership elected for epoch 7 whose term fails with `failure`: its terms thread's
    loop, run here until the stop that follows."""
    leadership = Leadership("postgresql://unused", "http://127.0.0.1:1", 5.0, _Store())  # type: ignore[arg-type]

    def elected(epoch: int) -> None:
        raise failure

    leadership.on_elected = elected
    leadership._epoch = 7  # as the lease thread sets it on winning
    leadership._terms.put(("elected", 7))
    leadership._terms.put(("stop", 0))
    with caplog.at_level(logging.WARNING, logger="tiny_scheduler.cluster.leadership"):
        leadership._run_terms()
    assert not leadership.is_serving()
    return [r for r in caplog.records if "term 7 failed" in r.getMessage()]


def test_a_term_the_database_failed_is_logged_as_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    (record,) = run_one_term(_store_failure(), caplog)
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    assert "administrator command" in record.getMessage()


def test_a_term_a_bug_failed_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    (record,) = run_one_term(KeyError("seq"), caplog)
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
