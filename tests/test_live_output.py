"""Live output and the event stream on a real daemon under the project's worker: appends and
reads by offset, a read that waits for output (parked, holding no request thread), the cap's
kept tail, the event stream in order and resumed, waiters beyond MAX_WAITERS, bad input."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

import pytest
import requests
from conftest import SchedulerFactory, stop_scheduler
from helpers import Api, expect_error, expect_json, wait_for

RUNNING = {"status": "running", "exit_code": None, "stdout": "", "stderr": ""}


@pytest.fixture
def live(scheduler_factory: SchedulerFactory) -> Iterator[Api]:
    # Two request threads: every waiter below would hold one of them if it waited in it.
    proc = scheduler_factory(
        {
            "REGISTRY_URL": "builtin",
            "SCHEDULER_THREADS": "2",
            "MAX_WAITERS": "8",
            "MAX_OUTPUT_BYTES": "1024",
        }
    )
    api = Api(proc.url)
    heartbeat = b'{"cpu_count":4,"running":[]}'
    expect_json(api.request("PUT", "/nodes/n1", data=heartbeat), 200)
    yield api
    api.close()


def running_job(api: Api) -> str:
    job_id = api.submit(command="sleep 600")["job_id"]
    expect_json(api.patch(f"/jobs/{job_id}", RUNNING), 200)
    return job_id


def read(api: Api, job_id: str, **params: object) -> requests.Response:
    response = api.get(f"/jobs/{job_id}/output", params=params, timeout=40)
    assert response.status_code == 200, response.text
    return response


def test_appended_output_is_read_from_any_offset(live: Api) -> None:
    job_id = running_job(live)
    assert live.post(f"/jobs/{job_id}/output", {"stdout": "one\n"}).status_code == 204
    assert (
        live.post(f"/jobs/{job_id}/output", {"stdout": "two\n", "stderr": "e"}).status_code == 204
    )
    first = read(live, job_id)
    assert first.content == b"one\ntwo\n"
    assert first.headers["X-Output-Offset"] == "8" and first.headers["X-Job-Status"] == "running"
    assert read(live, job_id, offset=4).content == b"two\n"
    assert read(live, job_id, offset=8).content == b""
    assert read(live, job_id, stream="stderr").content == b"e"
    # The final report replaces the live output; a follower at its offset gets the rest.
    done = {"status": "done", "exit_code": 0, "stdout": "one\ntwo\nthree\n", "stderr": "e"}
    expect_json(live.patch(f"/jobs/{job_id}", done), 200)
    last = read(live, job_id, offset=8)
    assert last.content == b"three\n" and last.headers["X-Job-Status"] == "done"


def test_past_the_cap_a_reader_gets_the_kept_tail_and_its_offset(live: Api) -> None:
    job_id = running_job(live)
    for n in range(5):
        live.post(f"/jobs/{job_id}/output", {"stdout": f"{n}" * 500})
    response = read(live, job_id, offset=0)
    assert response.headers["X-Output-Offset"] == "2500"
    assert response.content == (b"2" * 24 + b"3" * 500 + b"4" * 500)  # the last 1024 bytes


def test_waiting_reads_hold_no_thread_and_answer_when_output_arrives(live: Api) -> None:
    job_id = running_job(live)
    with ThreadPoolExecutor(6) as pool:
        waits = [pool.submit(read, live, job_id, offset=0, wait=20) for _ in range(6)]
        # Six waits and two request threads: the daemon still answers everything else.
        assert expect_json(live.get("/health", timeout=5), 200)["status"] == "healthy"
        assert all(not wait.done() for wait in waits)
        live.post(f"/jobs/{job_id}/output", {"stdout": "arrived\n"})
        answers = [wait.result(30) for wait in waits]
    assert [answer.content for answer in answers] == [b"arrived\n"] * 6


def test_a_wait_ends_with_the_job(live: Api) -> None:
    job_id = running_job(live)
    with ThreadPoolExecutor(1) as pool:
        wait = pool.submit(read, live, job_id, offset=0, wait=20)
        expect_json(live.post(f"/jobs/{job_id}/cancel"), 200)
        answer = wait.result(30)
    assert answer.content == b"" and answer.headers["X-Job-Status"] == "failed"


def test_waiters_beyond_max_waiters_get_503(live: Api) -> None:
    job_id = running_job(live)
    path = f"/jobs/{job_id}/output"

    def wait() -> requests.Response:
        return live.get(path, params={"wait": 20}, timeout=40)

    with ThreadPoolExecutor(9) as pool:
        waits = [pool.submit(wait) for _ in range(9)]
        # Eight wait (MAX_WAITERS); whichever came ninth is refused at once.
        (refused,) = [next(as_completed(waits, timeout=30)).result()]
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
        live.post(path, {"stdout": "x"})
        answers = [future.result(30) for future in waits]
    assert sorted(answer.status_code for answer in answers) == [200] * 8 + [503]
    assert [answer.content for answer in answers if answer.status_code == 200] == [b"x"] * 8


def test_bad_output_requests(live: Api) -> None:
    job_id = running_job(live)
    path = f"/jobs/{job_id}/output"
    for params, message in (
        ({"offset": "-1"}, "offset must be a whole number of bytes, 0 or more"),
        ({"offset": "x"}, "offset must be a whole number of bytes, 0 or more"),
        ({"wait": "31"}, "wait must be a number of seconds from 0 to 30"),
        ({"wait": "soon"}, "wait must be a number of seconds from 0 to 30"),
        ({"stream": "stdin"}, "stream must be stdout or stderr"),
    ):
        expect_error(live.get(path, params=params), 400, message)
    expect_error(live.get("/jobs/job-999/output"), 404, "job not found")
    pending = live.submit()["job_id"]
    expect_error(
        live.post(f"/jobs/{pending}/output", {"stdout": "x"}),
        409,
        f"job {pending} is pending, not running: no output",
    )


def events(
    api: Api, count: int, last_id: str | None = None, opened: threading.Event | None = None
) -> list[tuple[str, str, str]]:
    """The first `count` events of a stream, as (event, id, data). `opened` is set once the
    stream's headers arrived: the server has fixed where the stream starts by then."""
    headers = {"Last-Event-ID": last_id} if last_id else {}
    found: list[tuple[str, str, str]] = []
    with api.session.get(
        api.base_url + "/events", headers=headers, stream=True, timeout=30
    ) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        if opened is not None:
            opened.set()
        fields: dict[str, str] = {}
        for line in response.iter_lines(decode_unicode=True):
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if "event" in fields:
                found.append((fields["event"], fields.get("id", ""), fields.get("data", "")))
                if len(found) == count:
                    break
            fields = {}
    return found


def test_every_change_arrives_in_order_and_a_resume_misses_nothing(live: Api) -> None:
    opened = threading.Event()
    seen: list[tuple[str, str, str]] = []
    streaming = Api(live.base_url)  # a session of its own: the follower runs in its thread

    def follow() -> None:
        seen.extend(events(streaming, 60, opened=opened))

    follower = threading.Thread(target=follow)
    follower.start()
    assert opened.wait(30), "the event stream did not open"
    job_ids = [running_job(live) for _ in range(20)]
    for job_id in job_ids:
        expect_json(live.post(f"/jobs/{job_id}/cancel"), 200)
    follower.join(60)
    streaming.close()
    assert len(seen) == 60
    ids = [int(event_id) for _, event_id, _ in seen]
    assert ids == sorted(ids) and len(set(ids)) == 60
    per_job: dict[str, list[str]] = {}
    for kind, _, data in seen:
        assert kind == "job"
        record = __import__("orjson").loads(data)
        per_job.setdefault(record["job_id"], []).append(record["status"])
    assert all(statuses == ["pending", "running", "failed"] for statuses in per_job.values())
    # A client that resumes from the 30th event gets the 31st onwards.
    resumed = events(live, 30, last_id=str(ids[29]))
    assert [int(event_id) for _, event_id, _ in resumed] == ids[30:]


def test_a_resume_from_too_long_ago_starts_with_a_reset(live: Api) -> None:
    assert events(live, 1, last_id="1") == [("reset", "", "{}")]


def test_each_attempt_keeps_its_output_and_stale_reports_get_409(live: Api) -> None:
    """Over HTTP (issue 31): output read by attempt with X-Attempt, a report or output post
    naming an old attempt refused with the spec's 409, its output kept on that attempt."""
    job_id = live.submit(command="sleep 600")["job_id"]
    claim = {**RUNNING, "node_id": "n1", "attempt": 0}
    expect_json(live.patch(f"/jobs/{job_id}", claim), 200)
    named = {"node_id": "n1", "attempt": 0}
    assert live.post(f"/jobs/{job_id}/output", {"stdout": "one\n", **named}).status_code == 204
    first = read(live, job_id)
    assert (first.content, first.headers["X-Attempt"]) == (b"one\n", "0")
    # A cancel keeps what it printed, with the cancel's note as the last stderr line.
    cancelled = expect_json(live.post(f"/jobs/{job_id}/cancel"), 200)
    assert (cancelled["stdout"], cancelled["stderr"]) == ("one\n", "job cancelled")
    # The stopped job's late report brings the rest of its output.
    late = {"status": "failed", "exit_code": 143, "stdout": "one\ntwo\n", **named}
    after = expect_json(live.patch(f"/jobs/{job_id}", late), 200)
    assert (after["status"], after["reason"], after["stdout"]) == (
        "failed",
        "cancelled",
        "one\ntwo\n",
    )
    # A report about an attempt the job never had is stale.
    wrong = {**late, "attempt": 1}
    expect_error(
        live.patch(f"/jobs/{job_id}", wrong), 409, f"stale report: {job_id} is on attempt 1 on n1"
    )
    expect_error(
        live.post(f"/jobs/{job_id}/output", {"stdout": "x", "node_id": "n2"}),
        409,
        f"stale report: {job_id} is on attempt 1 on n1",
    )
    assert read(live, job_id, attempt=0).content == b"one\ntwo\n"
    missing = live.get(f"/jobs/{job_id}/output", params={"attempt": 1})
    expect_error(missing, 404, "attempt not found")
    expect_error(
        live.get(f"/jobs/{job_id}/output", params={"attempt": "x"}),
        400,
        "attempt must be a whole number, 0 for the first attempt",
    )
    bad = {**late, "attempt": -1}
    expect_error(live.patch(f"/jobs/{job_id}", bad), 400, "failed to decode update")


def test_a_stopping_daemon_ends_its_streams_and_answers_its_waits_at_once(
    scheduler_factory: SchedulerFactory,
) -> None:
    # Parked waits and streams would otherwise hold the worker for its whole graceful timeout
    # and then be cut off: a clean end of the stream, and the wait's answer, say they were not.
    proc = scheduler_factory({"REGISTRY_URL": "builtin", "MAX_WAITERS": "2"})
    api = Api(proc.url)
    expect_json(api.request("PUT", "/nodes/n1", data=b'{"cpu_count":4,"running":[]}'), 200)
    job_id = running_job(api)
    output = f"{api.base_url}/jobs/{job_id}/output"

    opened = threading.Event()

    def whole_stream() -> bytes:
        with requests.get(api.base_url + "/events", stream=True, timeout=60) as response:
            assert response.status_code == 200, response.text
            opened.set()  # the stream holds its MAX_WAITERS place from here
            # Raises ChunkedEncodingError when the stream is cut off instead of ended.
            return b"".join(response.iter_content(None))

    with ThreadPoolExecutor(2) as pool:
        stream = pool.submit(whole_stream)
        assert opened.wait(30), "the stream did not open"
        wait = None

        def both_waiting() -> bool:
            """The stream and one wait hold both MAX_WAITERS places (a probe is refused)."""
            nonlocal wait
            if wait is None or wait.done():  # a probe may have taken its place: again
                wait = pool.submit(requests.get, output, params={"wait": 30}, timeout=60)
            probe = requests.get(output, params={"wait": 0.01}, timeout=10)
            return probe.status_code == 503 and not wait.done()

        wait_for(both_waiting, timeout=30, message="the stream and the wait to be parked")
        assert stop_scheduler(proc) == 0
        assert wait is not None
        answer = wait.result(30)
        assert answer.status_code == 200 and answer.headers["X-Job-Status"] == "running"
        assert stream.result(30).startswith(b"retry:")  # and not cut off (no error)
