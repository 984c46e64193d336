"""The workflow fields of a job (issue 25): how a request's `depends_on`, `dependency`,
`priority` and `queue` are checked, and that a job which leaves them unset looks on the wire
exactly as it did before them. Pure: no service, no daemon."""

from __future__ import annotations

import orjson
import pytest

from tiny_scheduler import errors
from tiny_scheduler.domain import jobs, schedules, validation
from tiny_scheduler.domain.jobs import Dependency, Job


def parse(**fields: object) -> validation.JobRequest:
    return validation.parse_job_request(orjson.dumps({"command": "true", **fields}))


def refused(**fields: object) -> str:
    with pytest.raises(errors.BadRequest) as caught:
        parse(**fields)
    return caught.value.message


def test_unset_fields_take_their_defaults() -> None:
    request = parse()
    assert (request.depends_on, request.dependency, request.priority, request.queue) == (
        (),
        Dependency.OK,
        50,
        "default",
    )


def test_valid_fields_are_kept_and_repeated_dependencies_count_once() -> None:
    request = parse(
        depends_on=["job-3", "job-12", "job-3"], dependency="any", priority=0, queue="a.B_-9"
    )
    assert request.depends_on == (3, 12)
    assert request.dependency is Dependency.ANY
    assert (request.priority, request.queue) == (0, "a.B_-9")
    assert parse(priority=100, queue="q" * 64).priority == 100
    assert parse(priority=80.0).priority == 80  # JSON's integer: no fraction (as port)


@pytest.mark.parametrize(
    "fields",
    [
        {"depends_on": "job-3"},
        {"depends_on": {"job": 3}},
        {"depends_on": ["job-3", 4]},
        {"depends_on": ["job-03"]},
        {"depends_on": ["3"]},
        {"depends_on": [f"job-{n}" for n in range(1, 102)]},
        {"dependency": "afterok"},
        {"dependency": True},
        {"priority": 101},
        {"priority": -1},
        {"priority": 5.5},
        {"priority": "80"},
        {"priority": True},
        {"queue": ""},
        {"queue": "q" * 65},
        {"queue": "night ly"},
        {"queue": "a/b"},
        {"queue": 7},
    ],
)
def test_a_bad_field_is_refused_with_a_text_starting_with_its_name(
    fields: dict[str, object],
) -> None:
    (name,) = fields
    assert refused(**fields).startswith(f"{name} ")


def test_at_most_100_dependencies() -> None:
    assert len(parse(depends_on=[f"job-{n}" for n in range(1, 101)]).depends_on) == 100
    assert refused(depends_on=[f"job-{n}" for n in range(1, 102)]) == (
        "depends_on must name at most 100 jobs"
    )


def test_a_job_without_the_new_fields_shows_exactly_the_old_wire() -> None:
    job = Job(seq=7, node_id="node-a", command="echo hi", created_at=1)
    assert set(job.to_wire(with_attempts=True)) == {
        "job_id",
        "node_id",
        "command",
        "job_type",
        "status",
        "retry_count",
        "created_at",
    }


def test_set_fields_are_shown_on_the_wire() -> None:
    job = Job(
        seq=7,
        node_id="node-a",
        command="x",
        depends_on=(3, 4),
        dependency=Dependency.ANY,
        priority=0,
        queue="nightly",
    )
    wire = orjson.loads(orjson.dumps(job.to_wire()))
    assert wire["depends_on"] == ["job-3", "job-4"]
    assert (wire["dependency"], wire["priority"], wire["queue"]) == ("any", 0, "nightly")


def test_a_reason_for_failed_dependencies_exists_on_the_wire() -> None:
    assert "dependency_failed" in jobs.REASONS


def test_a_schedules_job_may_carry_every_new_field_but_depends_on() -> None:
    body = {"name": "n", "cron": "* * * * *", "job": {"command": "x"}}
    body["job"].update(priority=80, queue="nightly", dependency="any")  # type: ignore[union-attr]
    change = schedules.parse_schedule_request(orjson.dumps(body), partial=False)
    assert change.job is not None
    assert (change.job.priority, change.job.queue) == (80, "nightly")
    # Stored and shown as the request: the set fields come back, defaults stay out.
    assert validation.job_request_to_wire(change.job) == {
        "command": "x",
        "job_type": "run",
        "dependency": "any",
        "priority": 80,
        "queue": "nightly",
    }
    body["job"]["depends_on"] = ["job-1"]  # type: ignore[index]
    with pytest.raises(errors.BadRequest) as caught:
        schedules.parse_schedule_request(orjson.dumps(body), partial=False)
    assert caught.value.message.startswith("job.depends_on")


def test_an_old_schedules_job_reads_back_to_the_same_json() -> None:
    stored = {"command": "x", "job_type": "run", "timeout_secs": 5, "delay_secs": 0}
    request = validation.job_request_from(dict(stored))
    assert validation.job_request_to_wire(request) == stored
