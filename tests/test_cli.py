"""The `tiny-scheduler` client commands against a live scheduler.

The scheduler runs under real gunicorn with a key set, in a dev cluster of one real agent
process, so `--wait` sees jobs actually run. Commands run through click's CliRunner: the real
command code, in this process, talking HTTP to the real server.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
import zipfile
from collections.abc import Iterator

import pytest
import requests
from click.testing import CliRunner, Result

from tiny_scheduler.cli import main
from tiny_scheduler.dev.cluster import ClusterConfig, DevCluster
from tiny_scheduler.dev.daemon import free_port

KEY = "cli-test-key"
IDLE_NODE = "idle-node"
"""A healthy node no agent serves: jobs pinned to its instance stay pending."""

SCHEDULER_ENV = {
    "MAX_JOB_RETRIES": "1",
    "MAX_JOBS_PER_NODE": "1",
    "JOB_RETENTION_SECS": "0",
    "SQS_URL": "",
    "SNS_URL": "",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    work = tmp_path_factory.mktemp("cli-cluster")
    config = ClusterConfig.quick(
        agents=1,
        api_key=KEY,
        work_dir=str(work),
        scheduler_env=SCHEDULER_ENV,
        # Tests add a node and use it at once.
        registry_cache_secs=0,
    )
    with DevCluster(config) as started:
        yield started


@pytest.fixture
def idle_instance(cluster: DevCluster) -> Iterator[str]:
    """An instance on a healthy node without an agent; removed again after the test."""
    registry = cluster.registry
    assert registry is not None
    registry.set_node(IDLE_NODE)
    registry.set_instance("i-idle", IDLE_NODE)
    yield "i-idle"
    registry.instances.pop("i-idle", None)
    registry.remove_node(IDLE_NODE)


def cli(target: DevCluster | str, *args: str, key: str | None = KEY) -> Result:
    """Run `tiny-scheduler ARGS` with SCHEDULER_URL and TINYAWS_API_KEY set (None: unset)."""
    url = target if isinstance(target, str) else target.scheduler_url
    env = {"SCHEDULER_URL": url, "TINYAWS_API_KEY": key}
    return CliRunner().invoke(main, list(args), env=env)


def submitted_id(cluster: DevCluster, *args: str) -> str:
    result = cli(cluster, "submit", "-q", *args)
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


def one_error_line(result: Result) -> str:
    """The error a failed command printed: exactly one line on stderr, nothing on stdout."""
    assert result.exit_code != 0
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr.rstrip("\n")


# --- submit and wait ------------------------------------------------------------------------


def test_submit_wait_runs_the_job_and_exits_0(cluster: DevCluster) -> None:
    result = cli(
        cluster,
        *("submit", "--wait", "--interval", "0.1", "--env", "WHO=cli", "--env", "N=a=b"),
        'echo "hi $WHO $N"',
    )
    assert result.exit_code == 0, result.stderr
    fields = dict(line.split(None, 1) for line in result.stdout.splitlines())
    job_id = fields["job"]
    assert fields["status"] == "done (exit 0)"
    assert fields["env"] == "WHO=cli N=a=b"
    # Progress went to stderr, ending with the final state.
    assert result.stderr.splitlines()[-1].endswith(f"{job_id} done (exit 0)")

    logs = cli(cluster, "logs", job_id)
    assert logs.exit_code == 0, logs.stderr
    assert "hi cli a=b\n" in logs.stdout
    assert "attempt 1/1" in logs.stdout


def test_wait_exits_with_the_jobs_exit_code(cluster: DevCluster) -> None:
    result = cli(cluster, "submit", "--wait", "--json", "--interval", "0.1", "echo bad >&2; exit 7")
    assert result.exit_code == 7, result.stderr
    job = json.loads(result.stdout)
    assert (job["status"], job["exit_code"], len(job["attempts"])) == ("failed", 7, 1)

    # Already final: status --wait answers at once, with the same exit code.
    again = cli(cluster, "status", "--wait", job["job_id"])
    assert again.exit_code == 7
    assert "failed (exit 7)" in again.stdout


def test_logs_show_every_attempt(cluster: DevCluster) -> None:
    job_id = submitted_id(cluster, 'echo "out on $TINY_NODE_ID"; echo oops >&2; exit 3')
    assert cli(cluster, "status", "--wait", "--interval", "0.1", job_id).exit_code == 3

    text = cli(cluster, "logs", job_id)
    assert text.exit_code == 0, text.stderr
    assert "attempt 1/2 on node-1: failed (exit 3)" in text.stdout
    assert "attempt 2/2 on node-1: failed (exit 3) (latest)" in text.stdout
    assert text.stdout.count("--- stdout ---\nout on node-1\n") == 2
    assert text.stdout.count("--- stderr ---\noops\n") == 2

    data = json.loads(cli(cluster, "logs", "--json", job_id).stdout)
    assert [(a["exit_code"], a["stdout"], a["stderr"]) for a in data["attempts"]] == [
        (3, "out on node-1\n", "oops\n")
    ] * 2


def test_submit_sends_every_option(cluster: DevCluster, idle_instance: str) -> None:
    result = cli(
        cluster,
        *("submit", "--json", "--service", "--port", "8080", "--instance", idle_instance),
        *("--timeout", "5", "--deploy-url", "http://store/app.zip"),
        *("--", "python3", "-c", "print('a b')"),
    )
    assert result.exit_code == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["command"] == "python3 -c 'print('\"'\"'a b'\"'\"')'"
    expected = {
        "job_type": "service",
        "port": 8080,
        "instance_id": idle_instance,
        "node_id": IDLE_NODE,
        "timeout_secs": 5,
        "deploy_url": "http://store/app.zip",
        "status": "pending",
    }
    assert {name: job.get(name) for name in expected} == expected
    assert cli(cluster, "cancel", job["job_id"]).exit_code == 0


def test_idempotency_key_returns_the_first_job(cluster: DevCluster) -> None:
    first = submitted_id(cluster, "--idempotency-key", "cli-once", "echo once")
    second = submitted_id(cluster, "--idempotency-key", "cli-once", "echo once")
    assert first == second


def test_services_are_registered_and_reported_when_they_exit(cluster: DevCluster) -> None:
    ok = cli(cluster, "submit", "--service", "--port", "8081", "--wait", "--json", "true")
    assert ok.exit_code == 0, ok.stderr
    job = json.loads(ok.stdout)
    assert (job["status"], job["exit_code"], job["job_type"]) == ("done", 0, "service")
    assert cluster.registry is not None
    assert {"job_id": job["job_id"], "node_id": "node-1", "port": 8081}.items() <= next(
        s for s in cluster.registry.services if s.get("job_id") == job["job_id"]
    ).items()

    failing = cli(cluster, "submit", "--service", "--wait", "--interval", "0.1", "exit 4")
    assert failing.exit_code == 4
    assert "failed (exit 4)" in failing.stdout


@pytest.fixture(scope="module")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A loopback HTTP server for deploy zips: app.zip holds a start.sh, junk.zip is no zip."""
    folder = tmp_path_factory.mktemp("store")
    with zipfile.ZipFile(folder / "app.zip", "w") as archive:
        archive.writestr("start.sh", 'echo "started $(cat version.txt) with $WHO"\n')
        archive.writestr("version.txt", "v7")
    (folder / "junk.zip").write_bytes(b"not a zip")
    handler = functools.partial(_QuietFiles, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_deploy_url_runs_the_zips_start_sh(cluster: DevCluster, object_store: str) -> None:
    ran = cli(
        cluster,
        *("submit", "--wait", "--json", "--interval", "0.1", "--env", "WHO=cli"),
        *("--deploy-url", f"{object_store}/app.zip"),
    )
    assert ran.exit_code == 0, ran.stderr
    job = json.loads(ran.stdout)
    assert (job["command"], job["stdout"]) == ("", "started v7 with cli\n")

    for name, error in (("missing.zip", "download error: "), ("junk.zip", "extract failed: ")):
        failed = cli(
            cluster,
            *("submit", "--wait", "--json", "--interval", "0.1"),
            *("--deploy-url", f"{object_store}/{name}"),
        )
        assert failed.exit_code == 1
        job = json.loads(failed.stdout)
        assert (job["status"], job["exit_code"]) == ("failed", -1)
        assert job["stderr"].startswith(error), job["stderr"]


# --- list, status, cancel -------------------------------------------------------------------


def test_list_prints_an_aligned_table(cluster: DevCluster) -> None:
    ids = [submitted_id(cluster, f"echo row-{i}") for i in range(2)]
    for job_id in ids:
        assert cli(cluster, "status", "--wait", "--interval", "0.1", job_id).exit_code == 0

    table = cli(cluster, "list", "--status", "done", "--node", "node-1")
    assert table.exit_code == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    columns = "JOB STATUS EXIT NODE TYPE RETRIES CREATED COMMAND"
    assert header.split() == columns.split()
    for column in ("STATUS", "EXIT", "NODE", "COMMAND"):
        start = header.index(column)
        for row in rows:
            assert row[start - 2 : start] == "  " and row[start] != " ", (column, row)
    listed = {row.split()[0]: row for row in rows}
    assert set(ids) <= set(listed)
    assert listed[ids[0]].endswith("echo row-0")

    as_json = json.loads(cli(cluster, "list", "--json", "--status", "done").stdout)
    assert {job["status"] for job in as_json} == {"done"}
    assert set(ids) <= {job["job_id"] for job in as_json}


def test_list_limit_points_at_the_next_page(cluster: DevCluster) -> None:
    submitted_id(cluster, "true")
    submitted_id(cluster, "true")
    first = cli(cluster, "list", "--limit", "1")
    assert first.exit_code == 0, first.stderr
    (row,) = first.stdout.splitlines()[1:]
    assert row.startswith("job-1 ")
    assert first.stderr == "more jobs follow: add --after job-1\n"
    following = cli(cluster, "list", "--limit", "1", "--after", "job-1")
    assert following.stdout.splitlines()[1].startswith("job-2 ")


def test_pending_jobs_of_a_node_and_cancel(cluster: DevCluster, idle_instance: str) -> None:
    ids = [submitted_id(cluster, "--instance", idle_instance, "echo never") for _ in range(2)]

    # All of the node's queue, although the agent poll would answer only its free slot.
    pending = cli(cluster, "list", "--node", IDLE_NODE, "--status", "pending", "--json")
    assert [job["job_id"] for job in json.loads(pending.stdout)] == ids

    cancelled = cli(cluster, "cancel", ids[0])
    assert (cancelled.exit_code, cancelled.stdout) == (0, f"{ids[0]} cancelled\n")
    as_json = json.loads(cli(cluster, "cancel", "--json", ids[1]).stdout)
    assert as_json["status"] == "cancelled"
    empty = cli(cluster, "list", "--node", IDLE_NODE, "--status", "pending")
    assert (empty.exit_code, empty.stdout, empty.stderr) == (0, "", "no jobs\n")

    # A cancelled job is not a success.
    assert cli(cluster, "status", "--wait", ids[0]).exit_code == 1
    # Cancelling twice: the scheduler's 409 text, verbatim.
    server = requests.post(
        f"{cluster.scheduler_url}/jobs/{ids[0]}/cancel",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=10,
    )
    assert server.status_code == 409
    assert one_error_line(cli(cluster, "cancel", ids[0])) == f"error: {server.text.strip()}"


def test_status_shows_the_job(cluster: DevCluster) -> None:
    job_id = submitted_id(cluster, "--env", "A=1", "echo status")
    assert cli(cluster, "status", "--wait", "--interval", "0.1", job_id).exit_code == 0
    number = job_id.removeprefix("job-")
    shown = cli(cluster, "status", number)  # a bare number is a job id too
    assert shown.exit_code == 0, shown.stderr
    fields = dict(line.split(None, 1) for line in shown.stdout.splitlines())
    assert fields["job"] == job_id
    assert fields["command"] == "echo status"
    assert fields["node"] == "node-1"
    as_json = json.loads(cli(cluster, "status", "--json", job_id).stdout)
    assert (as_json["job_id"], as_json["stdout"]) == (job_id, "status\n")


# --- errors ---------------------------------------------------------------------------------


def test_unknown_job(cluster: DevCluster) -> None:
    for command in ("status", "logs", "cancel"):
        result = cli(cluster, command, "job-999999")
        assert result.exit_code == 1
        assert one_error_line(result) == "error: job not found"


def test_without_the_key_401_says_what_to_set(cluster: DevCluster) -> None:
    missing = cli(cluster, "list", key=None)
    assert missing.exit_code == 1
    assert one_error_line(missing) == (
        "error: unauthorized (set TINYAWS_API_KEY to the scheduler's key)"
    )
    wrong = cli(cluster, "submit", "true", key="not-the-key")
    assert one_error_line(wrong) == (
        "error: unauthorized (the scheduler rejected the key in TINYAWS_API_KEY)"
    )


def test_server_messages_are_shown_verbatim(cluster: DevCluster) -> None:
    empty = cli(cluster, "submit", "")
    assert one_error_line(empty) == "error: command or deploy_url is required"
    nowhere = cli(cluster, "submit", "--instance", "i-missing", "true")
    assert one_error_line(nowhere) == "error: instance not found"


def test_scheduler_down() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (("status", "job-1"), ("submit", "--wait", "true"), ("list",)):
        result = cli(url, *args)
        assert result.exit_code == 1
        assert one_error_line(result).startswith(f"error: cannot reach the scheduler at {url}")


def test_bad_usage_exits_2(cluster: DevCluster) -> None:
    assert cli(cluster, "submit", "--env", "NOEQUALS", "true").exit_code == 2
    assert cli(cluster, "submit").exit_code == 2
    assert cli(cluster, "submit", "--port", "0", "--service", "true").exit_code == 2


def test_a_timed_out_job_exits_1(cluster: DevCluster) -> None:
    # Last in the module: like the real agent, ours sits on the command until the cluster
    # stops, long after the scheduler has timed the job out.
    result = cli(cluster, "submit", "--wait", "--interval", "0.1", "--timeout", "1", "sleep 30")
    assert result.exit_code == 1, result.stdout + result.stderr
    assert "failed (exit -1)" in result.stdout
