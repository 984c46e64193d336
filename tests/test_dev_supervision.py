"""`tiny-scheduler dev --standby N` keeps N+1 daemons (issue #24): a daemon killed with
SIGKILL is started again after a moment, on its port, and comes back as a standby.

The real command, as a developer runs it, on a PostgreSQL server (skipped, visibly, without
one); every wait has a deadline, and nothing it started outlives it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import requests
from helpers import wait_for

CLI = os.path.join(os.path.dirname(sys.executable), "tiny-scheduler")
"""The installed command, as a developer runs it."""

SCHEDULER_ENV = {"JOB_RETENTION_SECS": "0", "SQS_URL": "", "SNS_URL": "", "TINYAWS_API_KEY": ""}
"""Whatever the developer's shell holds: no peers, no key."""

LIVENESS_SECS = 30.0
LEADER_LINE = re.compile(r"^leader: (\S+) \(epoch (\d+), pid (\d+)\)$")


def processes_using(folder: Path) -> list[int]:
    """Live processes whose command line or environment names `folder` (the cluster's work
    dir: its daemons, agents and their jobs)."""
    needle = str(folder).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
            if stat.rsplit(b")", 1)[-1].split()[0] == b"Z":
                continue  # dead, not yet reaped
            seen = Path(f"/proc/{entry}/cmdline").read_bytes()
            seen += Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue  # gone meanwhile
        if needle in seen:
            found.append(int(entry))
    return found


def leader_of(url: str) -> tuple[int, str | None]:
    try:
        reply = requests.get(url + "/leader", timeout=2)
    except requests.RequestException:
        return 0, None
    return reply.status_code, reply.json()["leader"]


def test_a_killed_daemon_is_started_again_as_a_standby(tmp_path: Path, postgres_url: str) -> None:
    work = tmp_path / "dev"
    # --port 0: free ports, so anything else listening on 9001 cannot fail the test.
    argv = [CLI, "dev", "--quick", "--agents", "1", "--standby", "1", "--port", "0"]
    argv += ["--postgres", postgres_url, "--work-dir", str(work)]
    dev = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **SCHEDULER_ENV},
        start_new_session=True,
        text=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert dev.stderr is not None
        for line in dev.stderr:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def leader_lines() -> list[tuple[str, int, int]]:
        found = [LEADER_LINE.match(line) for line in list(lines)]
        return [(m[1], int(m[2]), int(m[3])) for m in found if m]

    try:
        wait_for(leader_lines, timeout=LIVENESS_SECS, message=lambda: f"a leader in {lines}")
        first, epoch, pid = leader_lines()[0]
        # The other daemon, as the leader lists them (ports are the cluster's choice).
        listed = wait_for(
            lambda: (
                len(daemons := requests.get(first + "/cluster", timeout=5).json()["daemons"]) == 2
                and daemons
            )
        )
        [standby] = [daemon["url"] for daemon in listed if daemon["url"] != first]
        os.killpg(pid, signal.SIGKILL)  # the leader, as the banner tells developers to
        wait_for(
            lambda: f"restarted the daemon at {first}" in lines,
            timeout=LIVENESS_SECS,
            message=lambda: f"the restart in {lines}",
        )
        # The standby took over; the killed daemon is back, on its port, as a standby.
        wait_for(lambda: leader_of(standby) == (200, standby), timeout=LIVENESS_SECS)
        wait_for(lambda: leader_of(first) == (503, standby), timeout=LIVENESS_SECS)
        assert leader_lines()[-1][:2] == (standby, epoch + 1)
        cluster = requests.get(first + "/cluster", timeout=5).json()
        assert {d["url"]: d["role"] for d in cluster["daemons"]} == {
            standby: "leader",
            first: "standby",
        }
        dev.send_signal(signal.SIGTERM)
        assert dev.wait(timeout=LIVENESS_SECS) == 0, lines
    finally:
        if dev.poll() is None:
            os.killpg(dev.pid, signal.SIGKILL)
            dev.wait()
        reader.join(10)
        if dev.stderr is not None:
            dev.stderr.close()
    wait_for(lambda: processes_using(work) == [], message="every process of the cluster to end")
