"""GET /metrics against real schedulers: the numbers follow what jobs, agents, peers and HTTP
requests did; labels stay bounded; /metrics is open while the API and the dashboard ask for
the key; two schedulers in one process keep separate numbers.

This module's scheduler runs with TINYAWS_API_KEY set, so every test here also proves that
scraping needs no token.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Iterator

import pytest
import requests
from conftest import AppFactory, SchedulerFactory
from helpers import Agent, Api, compact, set_nodes, unique_node, wait_for
from prometheus_client.parser import text_string_to_metric_families

from tiny_scheduler.dev.daemon import SchedulerProcess
from tiny_scheduler.dev.registry import FakeRegistry
from tiny_scheduler.dev.sns import FakeSns
from tiny_scheduler.dev.sqs import FakeSqs
from tiny_scheduler.metrics import MAX_NODE_SERIES, OTHER_NODES, metrics_of

KEY = "metrics-test-key"
SCHEDULER_ENV = {"TINYAWS_API_KEY": KEY}

SNS_OK = {"peer": "sns", "endpoint": "publish", "result": "ok"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(base_url: str) -> Samples:
    """Every sample of GET /metrics (sent without any token), by name and sorted labels."""
    response = requests.get(base_url + "/metrics", timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    return parse(response.text)


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def grew(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture
def keyed_api(scheduler: SchedulerProcess) -> Iterator[Api]:
    client = Api(scheduler.url, key=KEY)
    yield client
    client.close()


def test_metrics_follow_the_life_of_jobs(
    scheduler: SchedulerProcess, keyed_api: Api, agent: Agent
) -> None:
    before = scrape(scheduler.url)

    done = keyed_api.submit(command="echo ok")
    flaky = keyed_api.submit(command="exit 3")
    cancelled = keyed_api.submit(command="never")
    assert [job.job_id for job in agent.poll()] == [done["job_id"]]
    assert agent.claim(done["job_id"]).status_code == 200
    assert agent.report(done["job_id"], 0, stdout="ok\n").status_code == 200
    for _ in range(2):  # one retry (MAX_JOB_RETRIES=1), then the final failure
        assert agent.claim(flaky["job_id"]).status_code == 200
        assert agent.report(flaky["job_id"], 3, stderr="boom\n").status_code == 200
    assert keyed_api.post(f"/jobs/{cancelled['job_id']}/cancel").status_code == 200

    after = scrape(scheduler.url)
    assert grew(before, after, "tiny_scheduler_jobs_submitted_total", source="http") == 3
    assert grew(before, after, "tiny_scheduler_jobs_submitted_total", source="sqs") == 0
    finished = "tiny_scheduler_jobs_finished_total"
    for status, reason in (("done", ""), ("failed", "exit"), ("failed", "cancelled")):
        assert grew(before, after, finished, status=status, reason=reason) == 1
    assert grew(before, after, finished, status="failed", reason="timeout") == 0
    # No job waits on the node now: its series is gone, not left at zero.
    assert ("tiny_scheduler_node_queue_depth", (("node", agent.node_id),)) not in after
    assert grew(before, after, "tiny_scheduler_job_retries_total") == 1
    assert grew(before, after, "tiny_scheduler_agent_polls_total") == 1
    assert grew(before, after, "tiny_scheduler_job_wait_seconds_count") == 3  # three claims
    run = "tiny_scheduler_job_run_seconds_count"
    assert grew(before, after, run, job_type="run", status="done") == 1
    assert grew(before, after, run, job_type="run", status="failed") == 2  # retried one too
    assert grew(before, after, "tiny_scheduler_job_timeouts_total") == 0

    http = "tiny_scheduler_http_request_duration_seconds_count"
    assert grew(before, after, http, endpoint="jobs.submit_job", code="201") == 3
    assert grew(before, after, http, endpoint="jobs.update_job", code="200") == 6
    assert grew(before, after, http, endpoint="jobs.cancel_job", code="200") == 1
    assert grew(before, after, http, endpoint="jobs.list_jobs", code="200") == 1
    # Every change above waited for its commit: 3 submissions, 6 updates, 1 cancel.
    assert grew(before, after, "tiny_scheduler_store_commit_duration_seconds_count") >= 1
    assert grew(before, after, "tiny_scheduler_store_commit_batch_size_sum") == 10
    # REGISTRY_CACHE_SECS=0: every placement asked the registry (3 submissions, 1 retry).
    nodes_ok = grew(
        before,
        after,
        "tiny_scheduler_peer_calls_total",
        peer="registry",
        endpoint="nodes",
        result="ok",
    )
    assert nodes_ok >= 4

    # The state gauges say what /health says, read at the same moment.
    counts = requests.get(scheduler.url + "/health", timeout=10).json()["jobs"]
    for status, count in counts.items():
        assert value(after, "tiny_scheduler_jobs", status=status) == count
    assert value(after, "tiny_scheduler_store_healthy") == 1
    assert value(after, "tiny_scheduler_sns_queue_depth") == 0  # SNS is off here


def test_labels_stay_bounded(scheduler: SchedulerProcess, keyed_api: Api) -> None:
    missing = "job-987654321"
    assert keyed_api.get(f"/jobs/{missing}").status_code == 404
    assert keyed_api.get(f"/no/such/path/{missing}").status_code == 404
    assert keyed_api.request("DELETE", "/jobs").status_code == 405

    text = requests.get(scheduler.url + "/metrics", timeout=10).text
    samples = parse(text)
    http = "tiny_scheduler_http_request_duration_seconds_count"
    assert value(samples, http, endpoint="jobs.get_job", code="404") >= 1
    assert value(samples, http, endpoint="unmatched", code="404") >= 1
    assert value(samples, http, endpoint="unmatched", code="405") >= 1
    # No job id and no path ever becomes a label value.
    assert not re.search(r'="job-\d+"', text)
    assert "/no/such/path" not in text
    endpoints = {dict(labels).get("endpoint") for (name, labels) in samples if name == http}
    assert endpoints <= {
        "health.health",
        "metrics.metrics",
        "schedule.schedule",
        "jobs.submit_job",
        "jobs.list_jobs",
        "jobs.get_job",
        "jobs.update_job",
        "jobs.cancel_job",
        "ui.overview",
        "ui.job_list",
        "ui.job",
        "ui.cancel",
        "ui.static",
        "unmatched",
    }


def test_metrics_are_open_and_the_dashboard_asks_for_the_key(scheduler: SchedulerProcess) -> None:
    url = scheduler.url
    before = scrape(url)  # no token: open

    asked = requests.get(url + "/ui/", timeout=10)
    assert asked.status_code == 401
    assert asked.headers["WWW-Authenticate"].startswith('Basic realm="tiny-scheduler"')
    wrong = requests.get(url + "/ui/", auth=("admin", "not-the-key"), timeout=10)
    assert wrong.status_code == 401
    page = requests.get(url + "/ui/", auth=("anyone", KEY), timeout=10)
    assert page.status_code == 200
    assert page.headers["Content-Type"].startswith("text/html")
    assert "Nodes" in page.text
    bearer = requests.get(url + "/ui/jobs", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert bearer.status_code == 200
    # The API itself still wants the bearer token, and Basic is no way around that.
    listing = requests.get(url + "/jobs", auth=("anyone", KEY), timeout=10)
    assert listing.status_code == 401
    assert listing.headers["WWW-Authenticate"].startswith("Bearer")

    after = scrape(url)
    http = "tiny_scheduler_http_request_duration_seconds_count"
    # A request refused by the auth check is timed too.
    assert grew(before, after, http, endpoint="ui.overview", code="401") == 2
    assert grew(before, after, http, endpoint="ui.overview", code="200") == 1
    assert grew(before, after, http, endpoint="metrics.metrics", code="200") == 1


def test_timeouts_moves_lost_nodes_and_peer_calls(
    scheduler_factory: SchedulerFactory, registry: FakeRegistry
) -> None:
    sqs, sns = FakeSqs().start(), FakeSns().start()
    try:
        lost, spare = unique_node("lost"), unique_node("spare")
        set_nodes(registry, [lost])
        proc = scheduler_factory(
            env={
                "TIMEOUT_SCAN_INTERVAL_SECS": "0.1",
                "NODE_LOST_SECS": "0.3",
                "SQS_URL": sqs.url,
                "SQS_POLL_INTERVAL_SECS": "0.1",
                "SNS_URL": sns.url,
            }
        )
        api = Api(proc.url)
        slow = api.submit(command="sleep 600", timeout_secs=1)
        stranded = api.submit(command="sleep 600")
        waiting = api.submit(command="echo later")
        agent = Agent(proc.url, lost)
        for job in (slow, stranded):
            assert agent.claim(job["job_id"]).status_code == 200
        sqs.send("jobs", compact({"command": "echo from sqs"}).decode())

        # The timeout fails `slow`; then the node goes away: `waiting` moves to the spare
        # node and `stranded` fails as lost (and is retried there).
        wait_for(lambda: api.job(slow["job_id"])["status"] == "failed", message="the timeout")
        set_nodes(registry, [spare], unhealthy=[lost])
        wait_for(lambda: api.job(waiting["job_id"])["node_id"] == spare, message="the move")
        wait_for(lambda: api.job(stranded["job_id"])["retry_count"] == 1, message="node lost")
        wait_for(lambda: len(sns.published("job-status")) >= 1, message="an SNS publish")

        def settled() -> Samples | None:
            samples = scrape(proc.url)
            done = (
                value(samples, "tiny_scheduler_jobs_submitted_total", source="sqs") == 1
                and value(samples, "tiny_scheduler_peer_calls_total", **SNS_OK) >= 1
            )
            return samples if done else None

        def counters() -> str:
            return str({k: v for k, v in scrape(proc.url).items() if k[0].endswith("_total")})

        samples = wait_for(settled, message=lambda: f"SQS and SNS in the metrics: {counters()}")
        assert value(samples, "tiny_scheduler_job_timeouts_total") == 1
        assert value(samples, "tiny_scheduler_jobs_moved_total", why="node_down") >= 1
        assert value(samples, "tiny_scheduler_node_lost_failures_total") == 1
        assert value(samples, "tiny_scheduler_job_retries_total") == 1
        failed = {"status": "failed", "reason": "timeout"}
        assert value(samples, "tiny_scheduler_jobs_finished_total", **failed) == 1
        sqs_ok = {"peer": "sqs", "result": "ok"}
        assert value(samples, "tiny_scheduler_peer_calls_total", endpoint="receive", **sqs_ok) >= 1
        assert value(samples, "tiny_scheduler_peer_calls_total", endpoint="delete", **sqs_ok) == 1
        depth = [name for (name, _) in samples if name == "tiny_scheduler_sns_queue_depth"]
        assert depth, "the SNS queue depth gauge is missing"
        api.close()
        agent.close()
    finally:
        sqs.stop()
        sns.stop()


def test_two_schedulers_in_one_process_keep_separate_numbers(make_app: AppFactory) -> None:
    """Narrow, in-process: each app has its own registry of metrics."""
    apps = [make_app("one"), make_app("two")]
    one, two = (app.test_client() for app in apps)
    assert one.post("/jobs", data=compact({"command": "true"})).status_code == 201
    first = parse(one.get("/metrics").get_data(as_text=True))
    second = parse(two.get("/metrics").get_data(as_text=True))
    submitted = "tiny_scheduler_jobs_submitted_total"
    assert value(first, submitted, source="http") == 1
    assert value(second, submitted, source="http") == 0
    assert value(first, "tiny_scheduler_jobs", status="pending") == 1
    assert value(second, "tiny_scheduler_jobs", status="pending") == 0
    assert metrics_of(apps[0]).registry is not metrics_of(apps[1]).registry


def test_sns_queue_depth_reads_the_publisher(make_app: AppFactory) -> None:
    """Narrow, in-process: with SNS on, the gauge is the publisher's queue, not a constant 0.

    The background threads are never started, so the final-state event stays queued."""
    app = make_app("sns", sns_url="http://127.0.0.1:9/never-contacted")
    client = app.test_client()
    created = client.post("/jobs", data=compact({"command": "true"}))
    assert created.status_code == 201
    job_id = created.get_json()["job_id"]
    assert client.post(f"/jobs/{job_id}/cancel").status_code == 200
    samples = parse(client.get("/metrics").get_data(as_text=True))
    assert value(samples, "tiny_scheduler_sns_queue_depth") == 1


def test_no_created_series(scheduler: SchedulerProcess, keyed_api: Api) -> None:
    keyed_api.submit(command="true")
    names = {name for name, _ in scrape(scheduler.url)}
    assert "tiny_scheduler_jobs_submitted_total" in names
    assert "tiny_scheduler_http_request_duration_seconds_count" in names
    assert sorted(name for name in names if name.endswith("_created")) == []


def test_the_per_node_queue_gauge_has_a_bounded_number_of_series(
    make_app: AppFactory, registry: FakeRegistry
) -> None:
    """Narrow, in-process: past MAX_NODE_SERIES nodes, the rest are added up in one series."""
    nodes = [f"node-{n:03d}" for n in range(MAX_NODE_SERIES + 5)]
    set_nodes(registry, nodes)
    client = make_app("many", registry_cache_secs=60).test_client()
    for _ in nodes:  # least-loaded: one job on every node
        assert client.post("/jobs", data=compact({"command": "true"})).status_code == 201
    assert client.post("/jobs", data=compact({"command": "true"})).status_code == 201
    samples = parse(client.get("/metrics").get_data(as_text=True))
    depths = {
        dict(labels)["node"]: count
        for (name, labels), count in samples.items()
        if name == "tiny_scheduler_node_queue_depth"
    }
    assert len(depths) == MAX_NODE_SERIES + 1
    assert depths[nodes[0]] == 2  # the extra job: the rotation came round again
    assert depths[OTHER_NODES] == 5
    assert sum(depths.values()) == len(nodes) + 1


def test_build_info_names_the_version(scheduler: SchedulerProcess) -> None:
    samples = scrape(scheduler.url)
    installed = importlib.metadata.version("tiny-scheduler")
    assert value(samples, "tiny_scheduler_build_info", version=installed) == 1
    assert [labels for name, labels in samples if name == "tiny_scheduler_build_info"] == [
        (("version", installed),)
    ]
