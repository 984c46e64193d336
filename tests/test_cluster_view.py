"""The daemons are visible (issue #24): `GET /cluster`, `tiny-scheduler cluster`, and the
leader metrics, on SQLite (one daemon) and on PostgreSQL (a leader and standbys), with real
daemons under gunicorn. Skipped, visibly, without a PostgreSQL server.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import requests
from click.testing import CliRunner
from conftest import SchedulerFactory
from helpers import expect_error, expect_json, wait_for
from test_ha import LONG_LEASE, Ha, leader_reply

from tiny_scheduler.cli import main
from tiny_scheduler.cluster.leadership import GONE_SECS

KEY = "cluster-sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}
FIELDS = ["id", "url", "role", "version", "started_at", "last_seen_at", "alive"]
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def cluster_of(url: str) -> dict[str, Any]:
    return expect_json(requests.get(url + "/cluster", headers=AUTH, timeout=5), 200)


def metric(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=5).text
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match is not None, f"{name} not in /metrics"
    return float(match.group(1))


def test_with_sqlite_the_one_daemon_is_the_cluster(scheduler_factory: SchedulerFactory) -> None:
    proc = scheduler_factory(env={"TINYAWS_API_KEY": KEY})
    expect_error(requests.get(proc.url + "/cluster", timeout=5), 401, "unauthorized")
    view = cluster_of(proc.url)
    assert (view["leader"], view["epoch"]) == (proc.url, 0)
    [me] = view["daemons"]
    assert list(me) == FIELDS
    assert (me["url"], me["role"]) == (proc.url, "leader")
    assert TIME.match(me["started_at"]) and TIME.match(me["last_seen_at"])
    assert metric(proc.url, "tiny_scheduler_leader") == 1
    assert metric(proc.url, "tiny_scheduler_leader_changes_total") == 0

    env = {"SCHEDULER_URL": proc.url, "TINYAWS_API_KEY": KEY}
    shown = CliRunner().invoke(main, ["cluster", "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["daemons"][0]["id"] == me["id"]
    table = CliRunner().invoke(main, ["cluster"], env=env)
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0] == f"leader: {proc.url}  (epoch 0)"
    header = ["ROLE", "STATE", "URL", "VERSION", "STARTED", "(UTC)", "LAST", "SEEN", "ID"]
    assert lines[1].split() == header
    assert lines[2].split()[:3] == ["leader", "up", proc.url]


def test_every_daemon_lists_the_leader_and_the_standbys(ha: Ha) -> None:
    env = {"TINYAWS_API_KEY": KEY}
    first = ha.start(lease=LONG_LEASE, env=env)
    assert ha.wait_leader() is first
    second, third = ha.start(lease=LONG_LEASE, env=env), ha.start(lease=LONG_LEASE, env=env)
    roles = {first.url: "leader", second.url: "standby", third.url: "standby"}

    def listed(url: str) -> dict[str, str]:
        return {daemon["url"]: daemon["role"] for daemon in cluster_of(url)["daemons"]}

    for proc in (first, second, third):  # a standby answers itself, with the key only
        wait_for(lambda proc=proc: listed(proc.url) == roles, message=f"{proc.url}'s list")
        view = cluster_of(proc.url)
        assert (view["leader"], view["epoch"]) == (first.url, 1)
        assert view["daemons"][0]["url"] == first.url  # the leader first
        assert all(list(daemon) == FIELDS for daemon in view["daemons"])
        expect_error(requests.get(proc.url + "/cluster", timeout=5), 401, "unauthorized")
    assert [metric(p.url, "tiny_scheduler_leader") for p in (first, second, third)] == [1, 0, 0]

    # Seen again and again while it runs; a killed daemon's "last seen" stops.
    def seen(url: str, of: str) -> str:
        return next(d["last_seen_at"] for d in cluster_of(url)["daemons"] if d["url"] == of)

    before = seen(first.url, third.url)
    wait_for(lambda: seen(first.url, third.url) > before, message="a later last_seen_at")
    third.kill()
    stopped = seen(first.url, third.url)
    wait_for(lambda: seen(first.url, second.url) > stopped, message="a round after the kill")
    later = seen(first.url, second.url)
    wait_for(lambda: seen(second.url, first.url) > later, message="another round")
    assert seen(first.url, third.url) <= later
    # ...and after a while it is marked gone (issue 36: it was listed as a standby "last seen
    # 46s ago", nothing saying it was dead), by the API, the command line and the dashboard.
    alive = {d["url"]: d["alive"] for d in cluster_of(first.url)["daemons"]}
    assert alive == {first.url: True, second.url: True, third.url: True}
    wait_for(
        lambda: (
            not next(d for d in cluster_of(first.url)["daemons"] if d["url"] == third.url)["alive"]
        ),
        timeout=GONE_SECS + 10,
        message="the killed daemon marked gone",
    )
    rows = CliRunner().invoke(main, ["cluster"], env={"SCHEDULER_URL": first.url, **env})
    states = {line.split()[2]: line.split()[:2] for line in rows.output.splitlines()[2:]}
    assert states[third.url] == ["standby", "gone"] and states[second.url] == ["standby", "up"]
    page = requests.get(first.url + "/ui/", headers=AUTH, timeout=10).text
    assert f'data-url="{third.url}" data-alive="no"' in page

    # The leader dies: the standby takes over and says so, in /cluster and in its metrics.
    changes = metric(second.url, "tiny_scheduler_leader_changes_total")
    first.kill()
    assert ha.wait_leader([second]) is second
    view = wait_for(lambda: (v := cluster_of(second.url))["daemons"][0]["role"] == "leader" and v)
    assert (view["leader"], view["epoch"]) == (second.url, 2)
    assert view["daemons"][0]["url"] == second.url
    assert metric(second.url, "tiny_scheduler_leader") == 1
    assert metric(second.url, "tiny_scheduler_leader_changes_total") == changes + 1

    # A daemon stopped on purpose leaves the list at once.
    fourth = ha.start(lease=LONG_LEASE, env=env)
    wait_for(lambda: fourth.url in listed(second.url), message="the new standby listed")
    assert leader_reply(fourth)[0] == 503
    fourth.stop()
    wait_for(lambda: fourth.url not in listed(second.url), message="the stopped one gone")

    env = {"SCHEDULER_URL": f"{fourth.url},{second.url}", "TINYAWS_API_KEY": KEY}
    table = CliRunner().invoke(main, ["cluster"], env=env)
    assert table.exit_code == 0, table.output
    assert table.output.splitlines()[0] == f"leader: {second.url}  (epoch 2)"
    assert table.output.splitlines()[2].split()[:3] == ["leader", "up", second.url]


def test_the_logs_say_each_daemons_role_and_the_first_leader_is_no_takeover(ha: Ha) -> None:
    first = ha.start(lease=LONG_LEASE)
    assert ha.wait_leader() is first
    second = ha.start(lease=LONG_LEASE)
    follows = f"leadership: standby {second.url}; the leader is {first.url} (epoch 1)"
    wait_for(lambda: follows in log_of(second), message="the standby naming its leader")
    first_log = log_of(first)
    assert "[INFO] leadership: leader of a new database, epoch 1" in first_log
    assert "took over" not in first_log  # nobody led before: not a failover, no WARNING
    assert log_of(second).count(follows) == 1  # once, not at every look
    first.kill()
    assert ha.wait_leader([second]) is second
    took = f"[WARNING] leadership: took over as leader from {first.url}, epoch 2"
    wait_for(lambda: took in log_of(second), message="the takeover in the log")


def log_of(proc: Any) -> str:
    return Path(proc.log_path).read_text(errors="replace")


def test_the_dashboard_says_which_daemon_you_are_on(ha: Ha) -> None:
    first = ha.start(lease=LONG_LEASE)
    assert ha.wait_leader() is first
    second = ha.start(lease=LONG_LEASE)
    wait_for(lambda: len(requests.get(first.url + "/cluster", timeout=5).json()["daemons"]) == 2)

    def overview(url: str) -> str:
        reply = requests.get(url + "/ui/", timeout=10, allow_redirects=False)
        assert reply.status_code == 200
        section = reply.text[reply.text.index('<section class="daemons"') :]
        return " ".join(re.sub(r"<[^>]+>", "", section[: section.index("</section>")]).split())

    at_leader = overview(first.url)
    assert f"You are on {first.url}, the leader." in at_leader
    assert f"Leader: {first.url} epoch 1" in at_leader
    assert re.search(rf"standby {re.escape(second.url)} · seen (just now|\d+ s ago)", at_leader)
    # Through the standby the page is the leader's, forwarded, and says where you are.
    through = overview(second.url)
    assert f"You are on {second.url}, the standby (it forwards to the leader)." in through
    assert f"standby {second.url} (you are here)" in through
