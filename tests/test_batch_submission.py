"""A batch submission (`Lifecycle.submit_batch`, `POST /jobs/batch`) on the harness: several
submissions in one transaction with consecutive ids, all or nothing, each checked and placed
as it would be alone (its errors prefixed with its index), one Idempotency-Key for the
batch.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from harness import Harness

from tiny_scheduler import errors
from tiny_scheduler.domain import validation
from tiny_scheduler.domain.jobs import Job
from tiny_scheduler.domain.limits import MAX_BATCH
from tiny_scheduler.service import Event


def batch(h: Harness, *items: dict[str, Any], key: str | None = None) -> tuple[list[Job], bool]:
    requests = validation.parse_batch(orjson.dumps(list(items)))
    return h.service.jobs.submit_batch(requests, key, owner="alice")


def committed(h: Harness) -> list[list[str]]:
    return [[job.job_id for job in commit.upserts] for commit in h.commits if commit.upserts]


def test_a_batch_is_one_transaction_of_consecutive_jobs_placed_in_turn() -> None:
    h = Harness()
    h.submit("before")
    made, created = batch(h, {"command": "a"}, {"command": "b", "array": 2}, {"command": "c"})
    assert created
    # The first job of each item answers; the array's copies are there too, in one commit.
    assert [job.job_id for job in made] == ["job-2", "job-3", "job-5"]
    assert committed(h)[-1] == ["job-2", "job-3", "job-4", "job-5"]
    assert [h.job(f"job-{seq}").command for seq in range(2, 6)] == ["a", "b", "b", "c"]
    # Each placed as its own submission would be, seeing the ones before it.
    assert [h.job(f"job-{seq}").node_id for seq in range(1, 6)] == [
        "node-a",
        "node-b",
        "node-c",
        "node-a",
        "node-b",
    ]
    assert {h.job(f"job-{seq}").owner for seq in range(2, 6)} == {"alice"}
    submitted = [job_id for event, job_id, _ in h.events if event == Event.SUBMITTED]
    assert submitted == [f"job-{seq}" for seq in range(1, 6)]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([{"command": "a"}, {"command": "b", "port": 70000}], "job 1: port must be an integer"),
        ([{"command": "a"}, "echo"], "job 1: failed to decode job"),
        ([{"command": "a"}, {"command": "b", "depends_on": ["job-99"]}], "job 1: depends_on"),
        ([{"command": "a", "cpus": 64}], "job 0: no node can run this job"),
    ],
)
def test_one_bad_item_refuses_the_whole_batch_naming_it(items: list[Any], message: str) -> None:
    h = Harness()
    before = len(h.commits)
    with pytest.raises(errors.BadRequest) as caught:
        batch(h, *items)
    assert caught.value.message.startswith(message), caught.value.message
    assert len(h.commits) == before  # nothing was committed
    assert h.submit("after").job_id == "job-1"  # and no id was spent


def test_an_unknown_instance_is_its_items_error() -> None:
    h = Harness()
    with pytest.raises(errors.PlacementError) as caught:
        batch(h, {"command": "a"}, {"command": "b", "instance_id": "i-nobody"})
    assert caught.value.message == "job 1: instance not found"


@pytest.mark.parametrize(
    "body",
    [b"{}", b"[]", b"not json", orjson.dumps([{"command": "x"}] * (MAX_BATCH + 1))],
)
def test_a_batch_is_a_list_of_one_to_max_batch_objects(body: bytes) -> None:
    with pytest.raises(errors.BadRequest) as caught:
        validation.parse_batch(body)
    assert caught.value.message == validation.BATCH_MESSAGE


def test_arrays_count_toward_the_batch_limit() -> None:
    body = orjson.dumps([{"command": "x", "array": MAX_BATCH}, {"command": "y"}])
    with pytest.raises(errors.BadRequest) as caught:
        validation.parse_batch(body)
    assert caught.value.message == validation.BATCH_SIZE_MESSAGE


def test_the_same_key_answers_the_same_jobs_and_makes_none() -> None:
    h = Harness()
    first, created = batch(h, {"command": "a"}, {"command": "b"}, {"command": "c"}, key="k")
    again, created_again = batch(h, {"command": "a"}, {"command": "b"}, {"command": "c"}, key="k")
    assert created and not created_again
    assert [job.job_id for job in again] == [job.job_id for job in first]
    other, _ = batch(h, {"command": "a"}, key="other")
    assert other[0].job_id == "job-4"


def test_dependencies_on_earlier_jobs_and_a_doomed_item() -> None:
    h = Harness()
    ok = h.submit("ok")
    bad = h.submit("bad")
    h.claim(bad.job_id)
    h.report(bad.job_id, exit_code=1)  # retried once (MAX_JOB_RETRIES 1 by default)
    h.claim(bad.job_id)
    h.report(bad.job_id, exit_code=1)
    assert h.job(bad.job_id).status == "failed"
    made, _ = batch(
        h,
        {"command": "after ok", "depends_on": [ok.job_id]},
        {"command": "after bad", "depends_on": [bad.job_id]},
    )
    assert made[0].status == "pending"
    assert (made[1].status, made[1].reason) == ("failed", "dependency_failed")
