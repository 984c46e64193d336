"""What a newcomer meets first: `/` leads to the dashboard, the banners of `serve` and `dev`
say where the dashboard is, and `/health` says which version runs.

Against the real daemon under gunicorn (the `scheduler` fixture) and a real `dev` cluster
started as a process, as a person would start it.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
from pathlib import Path

import requests
from helpers import wait_for

from tiny_scheduler.dev.daemon import SchedulerProcess, free_port

SCHEDULER_ENV = {"TINYAWS_API_KEY": "front-door-key"}


def test_root_redirects_to_the_dashboard_without_asking_for_the_key(
    scheduler: SchedulerProcess,
) -> None:
    reply = requests.get(scheduler.url + "/", allow_redirects=False, timeout=10)
    assert reply.status_code == 302
    assert reply.headers["Location"] == "ui/"
    # Followed, it reaches the dashboard, which asks for the key itself.
    followed = requests.get(scheduler.url + "/", timeout=10)
    assert followed.url == scheduler.url + "/ui/"
    assert followed.status_code == 401
    keyed = requests.get(scheduler.url + "/", auth=("", "front-door-key"), timeout=10)
    assert keyed.status_code == 200
    assert "text/html" in keyed.headers["Content-Type"]


def test_health_says_the_version(scheduler: SchedulerProcess) -> None:
    body = requests.get(scheduler.url + "/health", timeout=10).json()
    assert body["version"] == importlib.metadata.version("tiny-scheduler")


def test_the_dev_banner_names_the_dashboard(tmp_path: Path) -> None:
    port = free_port()
    dev = subprocess.Popen(
        [
            *(sys.executable, "-m", "tiny_scheduler.cli", "dev", "--quick", "--agents", "1"),
            *("--port", str(port), "--work-dir", str(tmp_path / "dev")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "TINYAWS_API_KEY"},
        start_new_session=True,
    )
    try:
        assert dev.stdout is not None
        lines = []
        for line in dev.stdout:  # the banner comes once the cluster is up
            lines.append(line)
            if line.startswith(("dashboard", "Ctrl-C")):  # the banner's last line
                break
        assert lines and lines[-1].split() == ["dashboard", f"http://127.0.0.1:{port}/ui/"], lines
        page = wait_for(lambda: requests.get(lines[-1].split()[1], timeout=10))
        assert page.status_code == 200
    finally:
        dev.send_signal(signal.SIGINT)
        dev.communicate(timeout=60)
