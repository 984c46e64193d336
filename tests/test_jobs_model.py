"""The Job model: its wire shape, the time format, the output cap and the state machine."""

from __future__ import annotations

import itertools
import re

import pytest
from helpers import ALWAYS_PRESENT, WIRE_ORDER, assert_no_nulls

from tiny_scheduler.clock import SYSTEM
from tiny_scheduler.domain import jobs
from tiny_scheduler.domain.jobs import Attempt, Job, Output, TransitionError

T0 = 1_764_498_030_123_456  # 2025-11-30T10:20:30.123456Z


def new_job(**fields: object) -> Job:
    base: dict[str, object] = {
        "seq": 7,
        "node_id": "node-a",
        "command": "echo hi",
        "created_at": T0,
    }
    base.update(fields)
    return Job(**base)  # type: ignore[arg-type]


def full_job() -> Job:
    return new_job(
        instance_id="i-1",
        deploy_url="http://store/app.zip",
        job_type=jobs.SERVICE,
        port=8080,
        env_vars={"A": "1", "B": "two"},
        timeout_secs=30,
        not_before=T0 + 60_000_000,
        schedule_id="sched-2",
        status=jobs.FAILED,
        reason=jobs.Reason.EXIT,
        retry_count=1,
        exit_code=3,
        stdout="out",
        stderr="err",
        running_at=T0 + 1,
        finished_at=T0 + 2,
        attempts=(Attempt("node-b", 1, "o1", "e1", T0 + 3, T0 + 4),),
        dedupe_key="http:abc",
    )


# --- wire shape -----------------------------------------------------------------------------


def test_minimal_job_has_only_the_always_present_fields_in_order() -> None:
    wire = new_job().to_wire(with_attempts=True)
    assert list(wire) == list(ALWAYS_PRESENT)
    assert wire == {
        "job_id": "job-7",
        "node_id": "node-a",
        "command": "echo hi",
        "job_type": "run",
        "status": "pending",
        "retry_count": 0,
        "created_at": "2025-11-30T10:20:30.123456Z",
    }


def test_full_job_lists_every_field_in_the_spec_order() -> None:
    wire = full_job().to_wire(with_attempts=True)
    assert list(wire) == list(WIRE_ORDER)
    assert wire["env_vars"] == {"A": "1", "B": "two"}
    assert wire["running_at"] == "2025-11-30T10:20:30.123457Z"
    assert wire["attempts"] == [
        {
            "node_id": "node-b",
            "exit_code": 1,
            "stdout": "o1",
            "stderr": "e1",
            "running_at": "2025-11-30T10:20:30.123459Z",
            "finished_at": "2025-11-30T10:20:30.123460Z",
        }
    ]
    assert wire["reason"] == "exit"
    for hidden in ("dedupe_key", "holds_slot", "moved_from"):
        assert hidden not in wire


def test_attempts_only_when_asked_for() -> None:
    assert "attempts" not in full_job().to_wire()


def test_exit_code_zero_and_empty_command_are_shown() -> None:
    wire = new_job(command="", deploy_url="http://x/a.zip", exit_code=0).to_wire()
    assert wire["exit_code"] == 0
    assert wire["command"] == ""


def test_empty_optional_fields_are_left_out() -> None:
    wire = new_job(env_vars={}, port=0, timeout_secs=0, stdout="", stderr="").to_wire()
    assert list(wire) == list(ALWAYS_PRESENT)


@pytest.mark.parametrize(
    "job",
    [
        new_job(),
        full_job(),
        new_job(exit_code=None, running_at=None, finished_at=None, env_vars=None),
        new_job(attempts=(Attempt("node-b", None, "", "", None, None),)),
    ],
)
def test_no_null_anywhere(job: Job) -> None:
    assert_no_nulls(job.to_wire(with_attempts=True))


def test_attempt_wire_shape() -> None:
    assert Attempt("node-b", 1, "o", "e", T0, T0 + 5).to_wire() == {
        "node_id": "node-b",
        "exit_code": 1,
        "stdout": "o",
        "stderr": "e",
        "running_at": "2025-11-30T10:20:30.123456Z",
        "finished_at": "2025-11-30T10:20:30.123461Z",
    }
    assert Attempt("node-c", 0, "", "boom", T0, None).to_wire() == {
        "node_id": "node-c",
        "exit_code": 0,
        "stderr": "boom",
        "running_at": "2025-11-30T10:20:30.123456Z",
    }
    assert Attempt("node-c", None, "", "", None, None).to_wire() == {"node_id": "node-c"}


# --- times ----------------------------------------------------------------------------------

TIME_FORMAT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.mark.parametrize(
    ("us", "text"),
    [
        (0, "1970-01-01T00:00:00.000000Z"),
        (T0, "2025-11-30T10:20:30.123456Z"),
        (1_800_000_000_000_001, "2027-01-15T08:00:00.000001Z"),
    ],
)
def test_format_time_is_utc_with_microseconds_and_z(us: int, text: str) -> None:
    assert jobs.format_time(us) == text
    assert TIME_FORMAT.match(text)


def test_parse_time_round_trips_to_the_microsecond() -> None:
    for us in (0, 1, T0, T0 + 999_999, SYSTEM.now_us(), 4_102_444_799_999_999):
        assert jobs.parse_time(jobs.format_time(us)) == us


def test_parse_time_accepts_offsets_and_short_fractions() -> None:
    assert jobs.parse_time("2026-05-01T10:00:03.123+05:30") == jobs.parse_time(
        "2026-05-01T04:30:03.123000Z"
    )
    assert jobs.parse_time("2026-05-01T09:58:10Z") == jobs.parse_time("2026-05-01T09:58:10.000000Z")


def test_now_us_formats_in_the_wire_format() -> None:
    assert TIME_FORMAT.match(jobs.format_time(SYSTEM.now_us()))


# --- ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seq"),
    [
        ("job-1", 1),
        ("job-123456", 123456),
        ("job-0", None),
        ("job-01", None),
        ("job-", None),
        ("job-1x", None),
        ("job--1", None),
        ("job-\u0661", None),  # an Arabic-Indic digit is a digit to str.isdigit
        ("Job-1", None),
        ("1", None),
        ("job-" + "9" * 19, None),
    ],
)
def test_parse_job_id_takes_only_canonical_ids(text: str, seq: int | None) -> None:
    assert jobs.parse_job_id(text) == seq


# --- output cap -----------------------------------------------------------------------------

MARKER = re.compile(r"^\[tiny-scheduler: output truncated, (\d+) earlier bytes dropped\]\n")


def check_capped(original: str, cap: int) -> str:
    """Assert the cap's promises and return the kept tail."""
    capped = jobs.cap_output(original, cap)
    data = original.encode()
    assert len(capped.encode()) <= cap
    match = MARKER.match(capped)
    assert match, capped[:80]
    tail = capped[match.end() :]
    assert original.endswith(tail)
    # Only a character split by the cut may be lost, beyond what the marker needs.
    assert len(tail.encode()) >= cap - match.end() - 3
    assert int(match.group(1)) <= len(data) - len(tail.encode())
    return tail


def test_output_within_the_cap_is_kept_whole() -> None:
    assert jobs.cap_output("", 256) == ""
    assert jobs.cap_output("x" * 256, 256) == "x" * 256
    assert jobs.cap_output("é" * 128, 256) == "é" * 128  # exactly 256 bytes


def test_output_over_the_cap_keeps_the_tail_behind_a_marker() -> None:
    original = "".join(f"line {n}\n" for n in range(1000))
    tail = check_capped(original, 300)
    assert tail.endswith("line 999\n")
    assert len(jobs.cap_output(original, 300).encode()) == 300


@pytest.mark.parametrize("char", ["é", "€", "𝄞"])
@pytest.mark.parametrize("cap", [256, 257, 258, 1000])
def test_output_cap_counts_utf8_bytes_of_multibyte_characters(char: str, cap: int) -> None:
    check_capped("start" + char * 2000, cap)


def test_output_one_byte_over_the_cap() -> None:
    check_capped("y" * 257, 256)


# --- state machine --------------------------------------------------------------------------

# The spec's statuses, written out: taken from jobs.STATUSES, a status dropped there would
# silently drop its cases here too.
STATUSES = ("pending", "running", "done", "failed")
UPDATE_STATUSES = ("running", "done", "failed")  # what a PATCH may ask for
ALLOWED = {("pending", "running"), ("running", "done"), ("running", "failed")}


@pytest.mark.parametrize(("current", "wanted"), list(itertools.product(STATUSES, UPDATE_STATUSES)))
def test_update_transitions(current: str, wanted: str) -> None:
    job = new_job(status=current)
    if (current, wanted) in ALLOWED:
        jobs.check_update(job, wanted)
    else:
        with pytest.raises(TransitionError) as caught:
            jobs.check_update(job, wanted)
        assert caught.value.current == current
        assert current in str(caught.value)


@pytest.mark.parametrize("current", STATUSES)
def test_a_job_that_has_not_ended_can_be_cancelled(current: str) -> None:
    job = new_job(status=current)
    if current in ("pending", "running"):
        cancelled = jobs.cancel(job, T0 + 9)
        assert cancelled.to_wire() == {
            **job.to_wire(),
            "status": "failed",
            "reason": "cancelled",
            "exit_code": -1,
            "stderr": "job cancelled",
            "finished_at": jobs.format_time(T0 + 9),
        }
        assert cancelled.is_final
        assert not jobs.should_retry(cancelled, 5), "a cancel is final"
        # A running job's process is still on its node until its agent stops it.
        assert cancelled.holds_slot == (current == "running")
    else:
        with pytest.raises(TransitionError) as caught:
            jobs.cancel(job, T0 + 9)
        assert caught.value.current == current


def test_start_sets_running_at() -> None:
    started = jobs.start(new_job(), T0 + 5)
    assert (started.status, started.running_at) == (jobs.RUNNING, T0 + 5)


def test_finish_sets_exit_code_output_and_finished_at() -> None:
    running = jobs.start(new_job(), T0 + 5)
    done = jobs.finish(running, jobs.DONE, 0, "out", "err", T0 + 6)
    assert (done.status, done.exit_code, done.stdout, done.stderr, done.finished_at) == (
        jobs.DONE,
        0,
        "out",
        "err",
        T0 + 6,
    )
    assert done.is_final


def test_finish_with_empty_output_changes_no_output() -> None:
    running = new_job(status=jobs.RUNNING, running_at=T0, stdout="kept", stderr="also kept")
    failed = jobs.finish(running, jobs.FAILED, 2, "", "", T0 + 6)
    assert (failed.stdout, failed.stderr) == ("kept", "also kept")


def test_a_finished_job_never_runs_again() -> None:
    done = jobs.finish(jobs.start(new_job(), T0), jobs.DONE, 0, "", "", T0 + 1)
    with pytest.raises(TransitionError):
        jobs.start(done, T0 + 2)


@pytest.mark.parametrize(
    ("status", "reason", "retry_count", "max_retries", "expected"),
    [
        (jobs.FAILED, "exit", 0, 1, True),
        (jobs.FAILED, "exit", 1, 1, False),
        (jobs.FAILED, "exit", 0, 0, False),
        (jobs.FAILED, "exit", 2, 3, True),
        (jobs.FAILED, "node_lost", 0, 1, True),
        (jobs.FAILED, "timeout", 0, 1, False),
        (jobs.FAILED, "cancelled", 0, 1, False),
        (jobs.DONE, None, 0, 1, False),
    ],
)
def test_should_retry(
    status: str, reason: str | None, retry_count: int, max_retries: int, expected: bool
) -> None:
    job = new_job(
        status=status,
        reason=jobs.Reason(reason) if reason else None,
        retry_count=retry_count,
    )
    assert jobs.should_retry(job, max_retries) is expected


def test_a_failure_says_why_and_a_success_does_not() -> None:
    running = jobs.start(new_job(), T0 + 1)
    assert jobs.finish(running, jobs.FAILED, 2, "", "", T0 + 2).reason == "exit"
    assert jobs.finish(running, jobs.DONE, 0, "", "", T0 + 2).reason is None
    lost = jobs.fail_by_scheduler(running, jobs.Reason.NODE_LOST, T0 + 2)
    assert (lost.status, lost.reason, lost.exit_code, lost.stderr) == (
        "failed",
        "node_lost",
        -1,
        "node lost",
    )
    assert not lost.holds_slot, "whatever ran on a lost node is gone with it"
    retried = jobs.retry(lost, "node-b")
    assert retried.reason is None and "reason" not in retried.to_wire()


def test_a_timed_out_run_job_keeps_its_slot_until_its_late_report() -> None:
    running = jobs.start(new_job(), T0 + 1)
    timed_out = jobs.fail_by_scheduler(running, jobs.Reason.TIMEOUT, T0 + 9)
    assert (timed_out.status, timed_out.reason, timed_out.exit_code, timed_out.stderr) == (
        "failed",
        "timeout",
        -1,
        "job timed out",
    )
    assert timed_out.holds_slot and timed_out.uses_slot
    for status in ("done", "failed"):
        assert jobs.is_late_report(timed_out, status)
    assert not jobs.is_late_report(timed_out, "running"), "a timed-out job never runs again"
    freed = jobs.release_slot(timed_out)
    assert not freed.uses_slot
    assert freed.to_wire() == timed_out.to_wire(), "the late report leaves the job as it was"
    exited = jobs.finish(running, jobs.FAILED, 1, "", "", T0 + 9)
    assert not jobs.is_late_report(exited, "done"), "only a timeout's attempt can end late"


def test_a_timed_out_service_keeps_no_slot() -> None:
    # Services take no slot while they run, so there is none to keep (and the scan never
    # times them out; this is the model's own consistency).
    running = jobs.start(new_job(job_type=jobs.SERVICE), T0)
    assert not jobs.fail_by_scheduler(running, jobs.Reason.TIMEOUT, T0 + 1).holds_slot


@pytest.mark.parametrize(
    ("fields", "movable"),
    [
        ({}, True),
        ({"instance_id": "i-1"}, False),
        ({"job_type": jobs.SERVICE}, False),
        ({"status": jobs.RUNNING}, False),
        ({"status": jobs.DONE}, False),
    ],
)
def test_which_waiting_jobs_an_idle_node_may_take(fields: dict, movable: bool) -> None:
    assert jobs.can_move(new_job(**fields)) is movable


def test_retry_records_the_attempt_and_clears_the_attempt_fields() -> None:
    running = jobs.start(new_job(moved_from="node-z"), T0 + 1)
    failed = jobs.finish(running, jobs.FAILED, 2, "o", "e", T0 + 2)
    retried = jobs.retry(failed, "node-b")
    assert retried.status == jobs.PENDING
    assert retried.node_id == "node-b"
    assert retried.retry_count == 1
    assert retried.attempts == (Attempt("node-a", 2, "o", "e", T0 + 1, T0 + 2),)
    assert (retried.exit_code, retried.stdout, retried.stderr) == (None, "", "")
    assert (retried.reason, retried.moved_from) == (None, "")
    assert (retried.running_at, retried.finished_at) == (None, None)
    assert retried.created_at == T0
    assert list(retried.to_wire()) == list(ALWAYS_PRESENT)

    again = jobs.retry(
        jobs.finish(jobs.start(retried, T0 + 3), jobs.FAILED, 9, "", "x", T0 + 4), "c"
    )
    assert again.retry_count == 2
    assert [a.node_id for a in again.attempts] == ["node-a", "node-b"]
    assert again.attempts[1] == Attempt("node-b", 9, "", "x", T0 + 3, T0 + 4)


def test_run_deadline() -> None:
    assert jobs.run_deadline(new_job(), 60) is None  # not running
    running = new_job(status=jobs.RUNNING, running_at=T0)
    assert jobs.run_deadline(running, 60) == T0 + 60_000_000
    assert jobs.run_deadline(running.evolve(timeout_secs=5), 60) == T0 + 5_000_000
    assert jobs.run_deadline(running.evolve(job_type=jobs.SERVICE), 60) is None


def test_services_take_no_slot() -> None:
    assert new_job().takes_slot
    assert not new_job(job_type=jobs.SERVICE).takes_slot


# --- output, kept apart -----------------------------------------------------------------------


def test_a_jobs_outputs_by_attempt_number() -> None:
    assert full_job().outputs() == {0: Output("o1", "e1"), 1: Output("out", "err")}
    quiet = full_job().evolve(stdout="", attempts=(Attempt("b", 1, "", "", None, None),))
    assert quiet.outputs() == {1: Output("", "err")}
    assert new_job().outputs() == {}


def test_without_output_then_with_it_gives_the_job_back() -> None:
    job = full_job()
    bare = job.without_output()
    assert bare.outputs() == {}
    assert bare.evolve(stdout="out", stderr="err", attempts=job.attempts) == job
    assert bare.with_output(job.outputs()) == job
    plain = new_job()
    assert plain.without_output() is plain  # nothing to strip: no copy


def test_a_job_that_is_not_final_shows_no_output_of_its_own() -> None:
    """The store may already hold the end of the attempt the table still sees running."""
    retried = jobs.retry(full_job(), "node-c").without_output()  # pending, attempt 2 next
    stored = {0: Output("o1", "e1"), 1: Output("out", "err"), 2: Output("newer", "")}
    shown = retried.with_output(stored)
    assert (shown.stdout, shown.stderr) == ("", "")
    assert [(a.stdout, a.stderr) for a in shown.attempts] == [("o1", "e1"), ("out", "err")]


def test_cap_tail_is_cap_output_of_the_whole_text() -> None:
    for text in ("x" * 5000, "é" * 3000 + "end", "\U0001f680" * 2000, "ab\n" * 999):
        data = text.encode()
        for cap in (256, 1000, 4096):
            if len(data) > cap:
                assert jobs.cap_tail(data[-cap:], len(data), cap) == jobs.cap_output(text, cap)


def test_only_an_end_its_node_reported_counts_as_ended_by_report() -> None:
    # A waiting heartbeat counts such a job's slot as free and its stop order as no news;
    # an end the scheduler made itself may leave the process running on the node.
    running = jobs.start(new_job(), T0 + 1)
    assert jobs.ended_by_report(jobs.finish(running, jobs.DONE, 0, "", "", T0 + 2))
    assert jobs.ended_by_report(jobs.finish(running, jobs.FAILED, 1, "", "", T0 + 2))
    oom = jobs.finish(running, jobs.FAILED, 137, "", "", T0 + 2, jobs.Reason.OUT_OF_MEMORY)
    assert jobs.ended_by_report(oom)
    assert not jobs.ended_by_report(running)
    timed_out = jobs.fail_by_scheduler(running, jobs.Reason.TIMEOUT, T0 + 9)
    assert not jobs.ended_by_report(timed_out)
    assert not jobs.ended_by_report(jobs.release_slot(timed_out)), "its end was the scheduler's"
    lost = jobs.fail_by_scheduler(running, jobs.Reason.NODE_LOST, T0 + 9)
    assert not jobs.ended_by_report(lost)
    assert not jobs.ended_by_report(jobs.cancel(running, T0 + 9))
