"""Per-user limits (`domain/users.py`, `state/user_limits.py`, `service/user_ops.py`): at most
`max_running` of a user's `run` jobs run at once, cluster-wide; the poll hands out no more,
a claim past the limit is refused, and a waiting job says why. On the harness."""

from __future__ import annotations

import pytest
from harness import Harness

from tiny_scheduler import errors
from tiny_scheduler.domain import users, validation
from tiny_scheduler.domain.users import UserSettings

NODES = ("node-a", "node-b")


def test_the_rule() -> None:
    assert users.room(None, 5) is None
    assert users.room(UserSettings("alice"), 5) is None
    assert users.room(UserSettings("alice", 2), 1) == 1
    assert users.room(UserSettings("alice", 2), 3) == 0
    assert users.is_valid_name("alice@example.org")
    assert not users.is_valid_name("..") and not users.is_valid_name("a/b")


def test_settings_are_checked_with_their_messages() -> None:
    assert validation.parse_user_settings("alice", b'{"max_running":3}') == UserSettings("alice", 3)
    assert validation.parse_user_settings("alice", b"{}") == UserSettings("alice", None)
    for body, message in [
        (b'{"max_running":0}', users.MAX_RUNNING_MESSAGE),
        (b'{"max_running":"2"}', users.MAX_RUNNING_MESSAGE),
        (b"[]", "failed to decode user settings"),
    ]:
        with pytest.raises(errors.BadRequest) as refused:
            validation.parse_user_settings("alice", body)
        assert refused.value.message == message
    with pytest.raises(errors.BadRequest) as bad_name:
        validation.parse_user_settings("..", b"{}")
    assert bad_name.value.message == users.NAME_MESSAGE


def test_a_limited_user_never_runs_more_than_its_limit() -> None:
    h = Harness(nodes=NODES, max_jobs_per_node=4)
    h.service.users.update(UserSettings("alice", 2))
    mine = [h.submit(owner="alice") for _ in range(6)]
    theirs = [h.submit(owner="bob") for _ in range(2)]
    handed = h.poll("node-a") + h.poll("node-b")
    alice = [job_id for job_id in handed if job_id in {j.job_id for j in mine}]
    assert len(alice) == 2  # however many slots are free
    assert {j.job_id for j in theirs} <= set(handed)
    for job_id in handed:
        h.claim(job_id)
    # Both nodes polled at once may each have offered one: a claim past the limit is refused.
    extra = next(j for j in mine if j.job_id not in handed)
    with pytest.raises(errors.Conflict) as refused:
        h.claim(extra.job_id)
    assert refused.value.message == (
        f"job {extra.job_id} cannot start: user alice at its limit (2 running)"
    )
    assert h.service.reads.waiting_for(h.job(extra.job_id)) == "user alice at its limit (2 running)"
    assert h.poll("node-a") == [] and h.poll("node-b") == []
    h.report(alice[0])
    assert len(h.poll("node-a") + h.poll("node-b")) == 1


def test_the_listing_counts_each_user_s_jobs_and_the_limit_survives_a_restart() -> None:
    h = Harness(nodes=NODES)
    h.service.users.update(UserSettings("alice", 1))
    h.submit(owner="alice")
    running = h.submit(owner="bob")
    h.claim(running.job_id)
    listing = {view.user: view for view in h.service.users.listing()}
    assert (listing["alice"].pending, listing["alice"].max_running) == (1, 1)
    assert (listing["bob"].running, listing["bob"].max_running) == (1, None)
    again = h.restart()
    assert {view.user: view.max_running for view in again.service.users.listing()}["alice"] == 1
    h.service.users.update(UserSettings("alice", None))
    assert {view.user: view.max_running for view in h.service.users.listing()}["alice"] is None
