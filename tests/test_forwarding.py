"""Standbys forward to the leader (issue #24): a client needs one URL, and its key goes along.

Real daemons under gunicorn on one fresh PostgreSQL database per test: the leader on
127.0.0.1, a standby on another loopback address (127.0.0.2), so that a redirect between them
changes host, as between two machines. `requests`, like Go's HTTP client, drops
`Authorization` when it follows such a redirect: it is the shape of the tiny-aws CLI.
Timings are printed (`pytest -s`), never asserted.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import re
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import BASE_ENV, START_TIMEOUT
from helpers import Api, compact, expect_error, expect_json, set_nodes, wait_for
from pg_proxy import SilentProxy
from test_ha import LIVENESS_SECS, LONG_LEASE, SHORT_LEASE, Ha, all_jobs, leader_reply

from tiny_scheduler.agent.protocol import RUNNING_UPDATE, parse_poll_reply, report_update
from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry

KEY = "fwd-sekrit"
OTHER_HOST = "127.0.0.2"


def start_on(ha: Ha, host: str, env: dict[str, str] | None = None) -> SchedulerProcess:
    """A daemon of `ha` listening (and advertised) on `host`; stopped with the others."""
    proc = SchedulerProcess(
        ha.db_url,
        env={**BASE_ENV, "REGISTRY_URL": ha.registry_url, **(env or {})},
        log_path=str(ha.folder / f"scheduler-{host}-{len(ha.daemons)}.log"),
        host=host,
    )
    ha.daemons.append(proc)
    proc.start(timeout=START_TIMEOUT)
    return proc


def pair(ha: Ha, env: dict[str, str] | None = None) -> tuple[SchedulerProcess, SchedulerProcess]:
    """A leader on 127.0.0.1 and a standby on 127.0.0.2 that knows it."""
    env = {"LEADER_LEASE_SECS": str(LONG_LEASE), **(env or {})}
    leader = ha.start(env=env, lease=LONG_LEASE)
    assert ha.wait_leader() is leader
    standby = start_on(ha, OTHER_HOST, env)
    wait_for(lambda: leader_reply(standby)[1]["leader"] == leader.url, message="standby's view")
    return leader, standby


def rss_kib(pid: int, field: str) -> int:
    """VmRSS (now) or VmHWM (the peak so far) of a process, in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", status, re.M)
    assert match is not None, status
    return int(match.group(1))


@pytest.fixture
def keyed(ha: Ha) -> tuple[SchedulerProcess, SchedulerProcess]:
    return pair(ha, {"TINYAWS_API_KEY": KEY})


def test_a_keyed_client_on_another_host_name_gets_201_through_the_standby(
    ha: Ha, keyed: tuple[SchedulerProcess, SchedulerProcess]
) -> None:
    leader, standby = keyed
    assert standby.url.startswith(f"http://{OTHER_HOST}:")
    client = Api(standby.url, key=KEY)  # follows redirects, dropping the key across hosts
    created = expect_json(client.post("/jobs", {"command": "echo one url"}), 201)
    shown = expect_json(client.get(f"/jobs/{created['job_id']}"), 200)
    shown.pop("waiting_for", None)  # a read of a pending job says what it waits for
    assert shown == created
    client.close()
    stored = [job for job in all_jobs_keyed(leader.url) if job["command"] == "echo one url"]
    assert [job["job_id"] for job in stored] == [created["job_id"]]  # exactly once

    # The key is still checked, at the leader: none, or a wrong one, is refused.
    expect_error(
        requests.post(standby.url + "/jobs", data=b'{"command":"x"}', timeout=5),
        401,
        "unauthorized",
    )
    wrong = {"Authorization": "Bearer nope"}
    reply = requests.get(standby.url + "/jobs", headers=wrong, timeout=5)
    expect_error(reply, 401, "unauthorized")


def all_jobs_keyed(url: str) -> list[dict[str, Any]]:
    api = Api(url, key=KEY)
    try:
        return expect_json(api.get("/jobs", params={"limit": 10000}), 200)
    finally:
        api.close()


def test_the_307_stays_for_x_no_forward_and_ha_forward_0(
    ha: Ha, keyed: tuple[SchedulerProcess, SchedulerProcess]
) -> None:
    leader, standby = keyed
    headers = {"Authorization": f"Bearer {KEY}", "X-No-Forward": "1"}
    reply = requests.post(
        standby.url + "/jobs?a=%2F", data=b"{}", headers=headers, allow_redirects=False, timeout=5
    )
    assert reply.status_code == 307
    assert reply.headers["Location"] == leader.url + "/jobs?a=%2F"

    redirecting = start_on(
        ha,
        "127.0.0.3",
        {"LEADER_LEASE_SECS": str(LONG_LEASE), "TINYAWS_API_KEY": KEY, "HA_FORWARD": "0"},
    )
    wait_for(lambda: leader_reply(redirecting)[1]["leader"] == leader.url)
    reply = requests.get(redirecting.url + "/jobs/job-9?x=1", allow_redirects=False, timeout=5)
    assert (reply.status_code, reply.headers["Location"]) == (307, leader.url + "/jobs/job-9?x=1")


def test_every_endpoint_answers_the_same_through_a_standby(ha: Ha, registry: FakeRegistry) -> None:
    set_nodes(registry, ["fwd-node"])
    leader, standby = pair(ha, {"TINYAWS_API_KEY": KEY})
    auth = {"Authorization": f"Bearer {KEY}"}

    def both(method: str, path: str, **kwargs: Any) -> tuple[requests.Response, requests.Response]:
        """The same request at the leader and through the standby, never following a redirect."""
        kwargs.setdefault("headers", auth)
        at_leader = requests.request(
            method, leader.url + path, allow_redirects=False, timeout=10, **kwargs
        )
        through = requests.request(
            method, standby.url + path, allow_redirects=False, timeout=10, **kwargs
        )
        return at_leader, through

    def same(method: str, path: str, **kwargs: Any) -> requests.Response:
        at_leader, through = both(method, path, **kwargs)
        assert (through.status_code, through.content) == (
            at_leader.status_code,
            at_leader.content,
        ), (method, path)
        assert through.headers.get("Content-Type") == at_leader.headers.get("Content-Type")
        return through

    def alike(method: str, path: str, **kwargs: Any) -> tuple[Any, Any]:
        """A change made twice: same status, bodies equal but for ids and times."""
        at_leader, through = both(method, path, **kwargs)
        assert through.status_code == at_leader.status_code, (method, path, through.text)
        return at_leader.json(), through.json()

    one, two = alike("POST", "/jobs", data=compact({"command": "echo t", "node_id": "fwd-node"}))
    assert (one["status"], two["status"], two["command"]) == ("pending", "pending", "echo t")
    assert int(two["job_id"].split("-")[1]) == int(one["job_id"].split("-")[1]) + 1
    job = two["job_id"]
    same("GET", f"/jobs/{job}")
    same("GET", "/jobs?limit=5")
    same("GET", "/jobs?node_id=fwd-node&status=pending&after=job-0")
    same("GET", "/jobs/job-999999")  # 404
    same("GET", "/no/such/route")  # 404
    same("DELETE", "/jobs")  # 405
    same("POST", "/jobs", data=b"{not json")  # 400
    same("POST", "/jobs", data=b'{"command":"x"}', headers={})  # 401 without the key
    same("GET", "/schedule?instance_id=i-1")
    same("GET", f"/jobs/{job}/output?stream=stdout&offset=0")
    same("GET", "/openapi.json")
    same("GET", "/schedules")
    same("GET", "/nodes")
    same("HEAD", f"/jobs/{job}")

    # The agent's calls carry no key, and stay without one when forwarded.
    poll_at_leader, poll_through = both("GET", "/jobs?node_id=fwd-node&status=pending", headers={})
    assert poll_through.status_code == poll_at_leader.status_code == 200
    assert poll_through.content == poll_at_leader.content  # the same job offered again
    job = parse_poll_reply(poll_through.content)[0].job_id
    claim = requests.patch(standby.url + f"/jobs/{job}", data=compact(RUNNING_UPDATE), timeout=10)
    assert expect_json(claim, 200)["status"] == "running"
    again, at_leader = both("PATCH", f"/jobs/{job}", data=compact(RUNNING_UPDATE), headers={})
    assert (again.status_code, again.content) == (at_leader.status_code, at_leader.content)
    done = requests.patch(
        standby.url + f"/jobs/{job}", data=compact(report_update(0, "hi\n")), timeout=10
    )
    assert expect_json(done, 200)["status"] == "done"
    same("GET", f"/jobs/{job}")
    same("POST", f"/jobs/{job}/cancel")  # 409: already final

    schedule = {"name": "fwd-every-minute", "cron": "* * * * *", "job": {"command": "true"}}
    created = expect_json(
        requests.post(standby.url + "/schedules", data=compact(schedule), headers=auth, timeout=10),
        201,
    )
    same("GET", f"/schedules/{created['schedule_id']}")
    same("POST", "/schedules", data=compact(schedule))  # 409: the name is taken
    gone = requests.delete(
        standby.url + f"/schedules/{created['schedule_id']}", headers=auth, timeout=10
    )
    assert gone.status_code in (200, 204), gone.text
    same("GET", f"/schedules/{created['schedule_id']}")  # 404 now

    # A chunked request body goes through as it came; so does a streamed answer, as it comes.
    with requests.get(standby.url + "/events", headers=auth, stream=True, timeout=10) as events:
        assert events.status_code == 200
        assert events.headers["Content-Type"].startswith("text/event-stream")
        body = iter([b'{"command":', b'"echo chunked"}'])
        sent = requests.post(standby.url + "/jobs", data=body, headers=auth, timeout=10)
        chunked = expect_json(sent, 201)
        assert chunked["command"] == "echo chunked"
        for line in events.iter_lines():  # each read bounded by the timeout above
            if chunked["job_id"].encode() in line:
                break

    # The dashboard is the leader's, forwarded; /metrics, /health, /leader and /cluster are
    # the standby's own.
    assert both("GET", "/ui/")[1].status_code == 200
    assert requests.get(standby.url + "/health", timeout=5).json()["role"] == "standby"
    assert leader_reply(standby)[0] == 503


def test_a_6_mib_final_report_is_forwarded_with_bounded_memory(
    ha: Ha, registry: FakeRegistry
) -> None:
    set_nodes(registry, ["big-node"])
    leader, standby = pair(ha)
    agent = Api(standby.url)
    worker = standby.worker_pid
    # Warm the forwarding path up first (imports, buffers), so that only the big body counts.
    warm = expect_json(agent.post("/jobs", {"command": "warm", "node_id": "big-node"}), 201)
    expect_json(agent.patch(f"/jobs/{warm['job_id']}", compact(RUNNING_UPDATE)), 200)
    job = expect_json(agent.post("/jobs", {"command": "big", "node_id": "big-node"}), 201)
    expect_json(agent.patch(f"/jobs/{job['job_id']}", compact(RUNNING_UPDATE)), 200)
    before = rss_kib(worker, "VmRSS")
    peak_before = rss_kib(worker, "VmHWM")
    body = compact(report_update(0, "x" * (6 * 1024 * 1024)))
    assert len(body) > 6 * 1024 * 1024
    started = time.monotonic()
    reply = agent.patch(f"/jobs/{job['job_id']}", body, allow_redirects=False)
    took = time.monotonic() - started
    assert expect_json(reply, 200)["status"] == "done"
    peak = rss_kib(worker, "VmHWM")
    grew = (peak - max(before, peak_before)) if peak > peak_before else 0
    print(
        f"\n6 MiB report through the standby: {took:.3f}s;"
        f" standby RSS {before} KiB, peak +{grew} KiB"
    )
    # Holding the body whole (or the answer) takes at least its 6 MiB more; streamed, the
    # forward needs its 256 KiB chunks (the worker's own buffers make a few MiB of noise).
    assert grew < len(body) // 1024, f"the standby's peak RSS grew by {grew} KiB forwarding 6 MiB"
    stored = Api(leader.url).job(job["job_id"])
    assert stored["status"] == "done" and stored["stdout"].endswith("xxxx")
    agent.close()


def test_forwarding_overhead(ha: Ha) -> None:
    """Not a bound: the added time per request of going through a standby, printed."""
    leader, standby = pair(ha)
    job = Api(leader.url).submit(command="measure")
    timings = {}
    for name, url in (("direct", leader.url), ("forwarded", standby.url)):
        session = requests.Session()
        session.get(url + f"/jobs/{job['job_id']}", timeout=5)
        started = time.monotonic()
        for _ in range(200):
            reply = session.get(url + f"/jobs/{job['job_id']}", timeout=5, allow_redirects=False)
            assert reply.status_code == 200
        timings[name] = (time.monotonic() - started) / 200
        session.close()
    direct, forwarded = (timings[name] * 1000 for name in ("direct", "forwarded"))
    print(f"\nGET /jobs/{{id}}: {direct:.2f} ms direct, {forwarded:.2f} ms forwarded")


def test_a_client_that_waits_for_100_continue_is_forwarded_with_its_body(ha: Ha) -> None:
    # curl and others send `Expect: 100-continue` before a large body; the standby must
    # invite the body (it is the leader's to judge) and forward it whole, once.
    leader, standby = pair(ha)
    body = compact({"command": "echo expected " + "x" * 2000})
    host, port = standby.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        head = (
            f"POST /jobs HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {len(body)}\r\n"
            "Expect: 100-continue\r\nConnection: close\r\n\r\n"
        )
        sock.sendall(head.encode())
        with sock.makefile("rb") as reader:
            invited = reader.readline()
            assert invited.startswith(b"HTTP/1.1 100"), (
                f"no invitation to send the body: {invited!r}"
            )
            assert reader.readline() == b"\r\n"
            sock.sendall(body)
            status = reader.readline()
            answer = reader.read()
    assert status.startswith(b"HTTP/1.1 201"), (status, answer[-300:])
    job_id = json.loads(answer.split(b"\r\n\r\n", 1)[1])["job_id"]
    stored = [j for j in all_jobs(leader.url).values() if j["command"].startswith("echo expected")]
    assert [j["job_id"] for j in stored] == [job_id]


def test_a_forwarded_request_is_never_forwarded_again(ha: Ha) -> None:
    leader, standby = pair(ha)
    marked = {"X-Forwarded-By": "http://127.0.0.9:1"}
    reply = requests.get(standby.url + "/jobs", headers=marked, timeout=5)
    expect_error(reply, 503, "no leader")
    assert reply.headers["Retry-After"] == "1"
    # At the leader the marker changes nothing.
    assert requests.get(leader.url + "/jobs", headers=marked, timeout=5).status_code == 200


def test_a_leader_that_does_not_answer_gives_503_no_leader_within_the_deadline(ha: Ha) -> None:
    leader, standby = pair(ha)
    assert leader.proc is not None
    os.killpg(leader.proc.pid, signal.SIGSTOP)  # alive, holding its lease, answering nothing
    try:
        started = time.monotonic()
        reply = requests.post(standby.url + "/jobs", data=b'{"command":"x"}', timeout=60)
        took = time.monotonic() - started
        expect_error(reply, 503, "no leader")
        assert reply.headers["Retry-After"] == "1"
        print(f"\n503 after {took:.2f}s")
        assert took < 30  # the deadline is 10 s; generous for a shared machine
    finally:
        os.killpg(leader.proc.pid, signal.SIGCONT)


def test_a_standby_that_cannot_read_the_lease_answers_503_itself(ha: Ha) -> None:
    # The standby's way to the database goes silent; the leader's does not. After a lease
    # without a look at the lease row, the standby no longer knows who leads (the leader it
    # last saw may have lost the lease since), so it forwards nothing and answers 503 itself.
    leader = ha.start(lease=SHORT_LEASE)
    assert ha.wait_leader() is leader
    proxy = SilentProxy(ha.db_url)
    try:
        standby = ha.start(lease=SHORT_LEASE, db_url=proxy.url)
        wait_for(lambda: leader_reply(standby)[1]["leader"] == leader.url)
        assert requests.get(standby.url + "/jobs", timeout=15).status_code == 200  # forwarded
        proxy.cut()
        cut_at = time.monotonic()
        wait_for(
            lambda: leader_reply(standby)[1]["leader"] is None,
            timeout=LIVENESS_SECS,
            message="the standby to forget the leader",
        )
        print(f"\nno leader named {time.monotonic() - cut_at:.2f}s after the cut")
        reply = requests.post(standby.url + "/jobs", data=b'{"command":"echo x"}', timeout=15)
        expect_error(reply, 503, "no leader")
        assert reply.headers["Retry-After"] == "1"
        assert not [j for j in all_jobs(leader.url).values() if j["command"] == "echo x"]
        assert ha.leaders() == [leader]  # the leader itself is fine meanwhile
        proxy.heal()
        wait_for(lambda: leader_reply(standby)[1]["leader"] == leader.url, timeout=LIVENESS_SECS)
    finally:
        ha.stop()
        proxy.close()


def test_sigkill_of_the_leader_under_load_through_one_standby_loses_nothing(
    ha: Ha, registry: FakeRegistry
) -> None:
    nodes = ["fwd-load-1", "fwd-load-2"]
    set_nodes(registry, nodes)
    env = {"LEADER_LEASE_SECS": str(LONG_LEASE)}
    first = ha.start(lease=LONG_LEASE, env=env)
    assert ha.wait_leader() is first
    second = ha.start(lease=LONG_LEASE, env=env)
    entry = start_on(ha, OTHER_HOST, env)  # the only daemon the clients know
    wait_for(lambda: leader_reply(entry)[1]["leader"] == first.url)
    wait_for(lambda: leader_reply(second)[1]["leader"] == first.url)
    lock = threading.Lock()
    acked: dict[str, str] = {}
    reused: list[str] = []
    claims: collections.Counter[str] = collections.Counter()
    finished: set[str] = set()
    stop = threading.Event()
    deadline = time.monotonic() + 4 * LIVENESS_SECS  # every loop below ends by then anyway

    def call(
        session: requests.Session, method: str, path: str, **kwargs: Any
    ) -> requests.Response | None:
        """One call through the entry daemon, again after a 503 `no leader` (a takeover)."""
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                reply = session.request(
                    method, entry.url + path, timeout=15, allow_redirects=False, **kwargs
                )
            except requests.RequestException:
                return None
            if not (reply.status_code == 503 and reply.text == "no leader\n"):
                return reply
            time.sleep(0.05)  # Retry-After, shortened: polling for the new leader
        return None

    def submitter(number: int) -> None:
        session = requests.Session()
        for count in itertools.count():
            if stop.is_set() or time.monotonic() > deadline:
                break
            command = f"echo {number}-{count}"
            reply = call(session, "POST", "/jobs", data=compact({"command": command}))
            if reply is not None and reply.status_code == 201:
                with lock:
                    job_id = reply.json()["job_id"]
                    if job_id in acked:
                        reused.append(job_id)
                    acked[job_id] = command
        session.close()

    def agent(node_id: str) -> None:
        session = requests.Session()
        while not stop.is_set() and time.monotonic() < deadline:
            poll = call(session, "GET", "/jobs", params={"node_id": node_id, "status": "pending"})
            if poll is None or poll.status_code != 200:
                continue
            for job in parse_poll_reply(poll.content)[:1]:
                claim = call(session, "PATCH", f"/jobs/{job.job_id}", data=compact(RUNNING_UPDATE))
                if claim is None or claim.status_code != 200:
                    continue
                with lock:
                    claims[job.job_id] += 1
                # Reported until taken, as the real agent does (it spools reports): polling
                # with the job unreported would make the scheduler run it again elsewhere.
                update = compact(report_update(0, "ok"))
                report = call(session, "PATCH", f"/jobs/{job.job_id}", data=update)
                while report is not None and report.status_code >= 500:
                    time.sleep(0.05)  # bounded by `call`'s deadline
                    report = call(session, "PATCH", f"/jobs/{job.job_id}", data=update)
                if report is not None and report.status_code == 200:
                    with lock:
                        finished.add(job.job_id)
        session.close()

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(2)]
    threads += [threading.Thread(target=agent, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(acked) >= 20 and len(finished) >= 3, timeout=LIVENESS_SECS)
        killed_at = time.monotonic()
        first.kill()
        new = ha.wait_leader([second, entry])
        print(
            f"\nnew leader {new.url} serving {time.monotonic() - killed_at:.2f}s after the SIGKILL"
        )
        with lock:
            before = (len(acked), len(finished))
        wait_for(
            lambda: len(acked) >= before[0] + 20 and len(finished) >= before[1] + 3,
            timeout=LIVENESS_SECS,
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(LIVENESS_SECS + 20)

    stored = all_jobs(new.url)
    assert reused == [], "an id was handed out twice"
    assert [job_id for job_id in acked if job_id not in stored] == [], "acknowledged jobs lost"
    assert {job_id: stored[job_id]["command"] for job_id in acked} == acked
    assert [job_id for job_id, count in claims.items() if count > 1] == [], "claimed twice"
    assert all(stored[job_id]["status"] == "done" for job_id in finished)
