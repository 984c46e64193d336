"""The dev agent: a compute node for the local dev cluster, speaking the real agent's protocol.

It owns one node's side of the wire exactly as `peers.md` describes the real (Rust) agent:
register and heartbeat with the registry; every `poll_secs` ask the scheduler
`GET /jobs?node_id=<node>&status=pending` without auth; read the reply with the real agent's
strict parser (an unreadable reply means doing nothing that round); take the first job only;
claim it with the exact `RUNNING_UPDATE` PATCH and skip it unless that answers 2xx; run a `run`
job inline with `sh -c` in a scratch directory, `env_vars` added to the environment, and PATCH
`done`/`failed` with the exit code and output once (never retried). A `service` job is started
detached, registered with the registry (`POST /services`) and reported when it exits.

Dev-only extras, which change nothing on the wire: jobs see `TINY_NODE_ID` and `TINY_JOB_ID` in
their environment (the demo uses them to fail on one node only), and every child runs in its own
process group whose id is written to `children.pids` in the work directory, so the dev cluster
can clean up after an agent it SIGKILLed (a dead node takes its jobs with it). When a job's
shell exits, whatever it left running in its group is killed. On SIGTERM or
SIGINT the agent kills its children and exits without reporting them: to the scheduler that is
a lost node, as it would be for a real one.

Run it as its own process so that killing it is a real node failure:
`python -m tiny_scheduler.dev.agent --node NAME --scheduler URL --registry URL --poll-secs S`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from typing import Any

import requests

from ..client import session
from .agent_protocol import RUNNING_UPDATE, PolledJob, parse_poll_reply, report_update

log = logging.getLogger("tiny_scheduler.dev.agent")

DEFAULT_POLL_SECS = 3.0
"""Seconds between two polls, as the real agent does."""

DEFAULT_HEARTBEAT_SECS = 10.0
"""Seconds between two registry heartbeats (the registry marks a node unhealthy after 30 s)."""

HTTP_TIMEOUT = (2.0, 10.0)
"""(connect, read) seconds for every call; the real agent has none, but a dev agent that hangs
forever on a stopped scheduler helps nobody."""

DOWNLOAD_TIMEOUT = (5.0, 60.0)
"""(connect, read) seconds for fetching a `deploy_url` zip."""

KILL_GRACE_SECS = 1.0
"""Seconds children get between SIGTERM and SIGKILL when the agent shuts down."""

CHILDREN_FILE = "children.pids"
"""File in the work directory listing the process group of every live child, one a line."""


class Agent:
    """One dev compute node. `start()` runs it on threads; `shutdown()` ends it and its jobs."""

    def __init__(
        self,
        node_id: str,
        scheduler_url: str,
        registry_url: str,
        poll_secs: float = DEFAULT_POLL_SECS,
        heartbeat_secs: float = DEFAULT_HEARTBEAT_SECS,
        work_dir: str | None = None,
        registry_key: str | None = None,
        exit_with_parent: bool = False,
    ) -> None:
        self.node_id = node_id
        # Several URLs, comma-separated (a leader and its standbys): the agent asks the next
        # one when a poll cannot reach the current one, as a VIP would move to a live daemon.
        self.scheduler_urls = [url.strip().rstrip("/") for url in scheduler_url.split(",")]
        self.scheduler_url = self.scheduler_urls[0]
        self.registry_url = registry_url.rstrip("/")
        self.poll_secs = poll_secs
        self.heartbeat_secs = heartbeat_secs
        self.work_dir = work_dir or tempfile.mkdtemp(prefix=f"tiny-agent-{node_id}-")
        os.makedirs(self.work_dir, exist_ok=True)
        self._parent = os.getppid() if exit_with_parent else None
        # The scheduler is called without auth, like the real agent; the registry's /services
        # needs the key when the registry has one.
        self._scheduler = session(self.scheduler_url)
        self._registry = session(self.registry_url, registry_key)
        self._stop = threading.Event()
        self._children_lock = threading.Lock()
        self._children: dict[int, str] = {}  # process group id -> job id
        self._threads: list[threading.Thread] = []

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> Agent:
        self._spawn(self._heartbeat_loop, "heartbeat")
        self._spawn(self._poll_loop, "poll")
        return self

    def serve_forever(self) -> None:
        """Run until `stop()` (a signal handler calls it), then shut down."""
        self.start()
        while not self._stop.wait(1.0):
            pass
        self.shutdown()

    def stop(self) -> None:
        """Ask the agent to end; safe to call from a signal handler (it only sets a flag)."""
        self._stop.set()

    def shutdown(self) -> None:
        """Stop polling, kill every child's process group, wait for the threads."""
        self._stop.set()
        with self._children_lock:
            groups = list(self._children)
        kill_groups(groups, grace=KILL_GRACE_SECS)
        for thread in self._threads:
            thread.join(5.0)
        self._write_children()

    def _spawn(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(
            target=target, args=args, name=f"{self.node_id}-{name}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    # --- registry ---------------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        path = "/nodes/register"
        while not self._stop.is_set():
            if self._parent is not None and os.getppid() != self._parent:
                log.warning("%s: parent process is gone; shutting down", self.node_id)
                self.stop()
                return
            body = {
                "id": self.node_id,
                "hostname": self.node_id,
                "addr": "127.0.0.1",
                "cpu_count": os.cpu_count() or 1,
                "role": "compute",
            }
            try:
                reply = self._registry.post(
                    self.registry_url + path, json=body, timeout=HTTP_TIMEOUT
                )
                if reply.ok:
                    path = "/nodes/heartbeat"
                else:
                    log.warning(
                        "%s: registry %s answered %d", self.node_id, path, reply.status_code
                    )
            except requests.RequestException as exc:
                log.warning("%s: registry %s: %s", self.node_id, path, exc)
            self._stop.wait(self.heartbeat_secs)

    def _register_service(self, job: PolledJob) -> None:
        body = {
            "name": job.job_id,
            "job_id": job.job_id,
            "node_id": self.node_id,
            "addr": "127.0.0.1",
            "port": job.port or 0,
        }
        try:
            reply = self._registry.post(
                self.registry_url + "/services", json=body, timeout=HTTP_TIMEOUT
            )
            if not reply.ok:
                log.warning("%s: POST /services answered %d", self.node_id, reply.status_code)
        except requests.RequestException as exc:
            log.warning("%s: POST /services: %s", self.node_id, exc)

    # --- the scheduler protocol ---------------------------------------------------------------

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:
                # One bad round (a disk error in a scratch dir, say) must not end the node.
                log.exception("%s: poll round failed", self.node_id)
            self._stop.wait(self.poll_secs)

    def poll_once(self) -> str | None:
        """One round: poll, claim the first job, run it. Returns the job id it ran, if any."""
        try:
            reply = self._scheduler.get(
                self.scheduler_url + "/jobs",
                params={"node_id": self.node_id, "status": "pending"},
                timeout=HTTP_TIMEOUT,
            )
            polled = parse_poll_reply(reply.content)
        except (requests.RequestException, ValueError) as exc:
            # The real agent silently does nothing when it cannot read the reply.
            log.debug("%s: poll gave nothing usable: %s", self.node_id, exc)
            if isinstance(exc, requests.ConnectionError) and len(self.scheduler_urls) > 1:
                at = self.scheduler_urls.index(self.scheduler_url)
                self.scheduler_url = self.scheduler_urls[(at + 1) % len(self.scheduler_urls)]
            return None
        if not polled:
            return None
        job = polled[0]
        if not self._patch(job.job_id, RUNNING_UPDATE):
            return None
        log.info("%s: claimed %s", self.node_id, job.job_id)
        if job.job_type == "service":
            self._start_service(job)
        else:
            self._run(job)
        return job.job_id

    def _patch(self, job_id: str, body: dict[str, Any]) -> bool:
        """One PATCH /jobs/{id}, never retried; whether it answered 2xx."""
        try:
            reply = self._scheduler.patch(
                f"{self.scheduler_url}/jobs/{job_id}", json=body, timeout=HTTP_TIMEOUT
            )
        except requests.RequestException as exc:
            log.warning("%s: PATCH %s %s: %s", self.node_id, job_id, body["status"], exc)
            return False
        if not reply.ok:
            log.warning(
                "%s: PATCH %s %s answered %d: %s",
                self.node_id,
                job_id,
                body["status"],
                reply.status_code,
                reply.text.strip(),
            )
        return reply.ok

    def _report(self, job_id: str, exit_code: int, stdout: str = "", stderr: str = "") -> None:
        body = report_update(exit_code, stdout, stderr)
        if self._patch(job_id, body):
            log.info("%s: %s %s (exit %d)", self.node_id, job_id, body["status"], exit_code)

    # --- running jobs ------------------------------------------------------------------------

    def _run(self, job: PolledJob) -> None:
        scratch = tempfile.mkdtemp(prefix=f"{job.job_id}-", dir=self.work_dir)
        try:
            argv, cwd, error = self._prepare(job, scratch)
            if error:
                self._report(job.job_id, -1, stderr=error)
                return
            proc = self._popen(job, argv, cwd, subprocess.PIPE, subprocess.PIPE)
            try:
                out, err = proc.communicate()
            finally:
                self._forget(proc.pid)
            if self._stop.is_set():
                # Killed by our own shutdown: a node going away, not the job's doing.
                log.info("%s: %s interrupted by shutdown, not reported", self.node_id, job.job_id)
                return
            self._report(job.job_id, proc.returncode, _text(out), _text(err))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _start_service(self, job: PolledJob) -> None:
        scratch = tempfile.mkdtemp(prefix=f"{job.job_id}-", dir=self.work_dir)
        argv, cwd, error = self._prepare(job, scratch)
        if error:
            self._report(job.job_id, -1, stderr=error)
            shutil.rmtree(scratch, ignore_errors=True)
            return
        # Its output goes to files in its scratch dir (kept for the curious until it exits);
        # the report on exit carries none, as the real agent's does.
        with open(os.path.join(scratch, "service.log"), "wb") as log_file:
            proc = self._popen(job, argv, cwd, log_file, subprocess.STDOUT)
        self._register_service(job)
        self._spawn(self._watch_service, f"watch-{job.job_id}", job, proc, scratch)

    def _watch_service(self, job: PolledJob, proc: subprocess.Popen[bytes], scratch: str) -> None:
        code = proc.wait()
        self._forget(proc.pid)
        if not self._stop.is_set():
            self._report(job.job_id, code)
        shutil.rmtree(scratch, ignore_errors=True)

    def _prepare(self, job: PolledJob, scratch: str) -> tuple[list[str], str, str]:
        """What to execute and where: (argv, cwd, error). Fetches a deploy zip first."""
        if not job.deploy_url:
            return ["sh", "-c", job.command], scratch, ""
        try:
            reply = requests.get(job.deploy_url, timeout=DOWNLOAD_TIMEOUT)
            reply.raise_for_status()
        except requests.RequestException as exc:
            return [], scratch, f"download error: {exc}"
        app_dir = os.path.join(scratch, "app")
        try:
            with zipfile.ZipFile(io.BytesIO(reply.content)) as archive:
                archive.extractall(app_dir)
        except (zipfile.BadZipFile, OSError) as exc:
            return [], scratch, f"extract failed: {exc}"
        if job.command:
            return ["sh", "-c", job.command], app_dir, ""
        return ["sh", "start.sh"], app_dir, ""

    def _popen(
        self, job: PolledJob, argv: list[str], cwd: str, stdout: Any, stderr: Any
    ) -> subprocess.Popen[bytes]:
        env = {**os.environ, "TINY_NODE_ID": self.node_id, "TINY_JOB_ID": job.job_id}
        env.update(job.env_vars or {})
        with self._children_lock:
            # Own process group, so that shutdown (or the cluster, after a SIGKILL) can kill
            # whatever the command forked, not just the shell.
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
            )
            self._children[proc.pid] = job.job_id
            self._write_children_locked()
        if self._stop.is_set():  # shutdown raced with the start: it may have missed this one
            kill_groups([proc.pid], grace=0)
        return proc

    def _forget(self, pgid: int) -> None:
        """The job's shell has exited: kill whatever it left running in its group (a dev
        cluster must not collect stray processes), and stop tracking the group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with self._children_lock:
            self._children.pop(pgid, None)
            self._write_children_locked()

    def _write_children(self) -> None:
        with self._children_lock:
            self._write_children_locked()

    def _write_children_locked(self) -> None:
        path = os.path.join(self.work_dir, CHILDREN_FILE)
        with contextlib.suppress(OSError):
            with open(path + ".tmp", "w") as f:
                f.writelines(f"{pgid} {job_id}\n" for pgid, job_id in self._children.items())
            os.replace(path + ".tmp", path)


def kill_recorded_children(work_dir: str) -> list[int]:
    """SIGKILL every process group an agent recorded in `work_dir`; the groups it found.

    For the dev cluster, after it SIGKILLed an agent: the agent could not clean up, and a dead
    node must not leave its jobs running.
    """
    try:
        with open(os.path.join(work_dir, CHILDREN_FILE)) as f:
            groups = [int(line.split()[0]) for line in f if line.strip()]
    except (OSError, ValueError, IndexError):
        return []
    kill_groups(groups, grace=0)
    return groups


def kill_groups(groups: list[int], grace: float) -> None:
    """SIGTERM the process groups, give them `grace` seconds, then SIGKILL what is left."""
    if grace > 0:
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_group_alive(pgid) for pgid in groups):
            time.sleep(0.05)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tiny_scheduler.dev.agent", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--node", required=True, help="node id (the real agent uses its hostname)")
    parser.add_argument(
        "--scheduler", required=True, help="scheduler base URL (several: comma-separated)"
    )
    parser.add_argument("--registry", required=True, help="registry base URL")
    parser.add_argument("--poll-secs", type=float, default=DEFAULT_POLL_SECS)
    parser.add_argument("--heartbeat-secs", type=float, default=DEFAULT_HEARTBEAT_SECS)
    parser.add_argument("--work-dir", help="scratch directories go here (default: a temp dir)")
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="shut down when the parent process dies"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("AGENT_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s [%(levelname)s] %(message)s",
        stream=sys.stderr,
    )
    agent = Agent(
        node_id=args.node,
        scheduler_url=args.scheduler,
        registry_url=args.registry,
        poll_secs=args.poll_secs,
        heartbeat_secs=args.heartbeat_secs,
        work_dir=args.work_dir,
        # The agent's own key for the registry, as the rest of tiny-aws reads it.
        registry_key=os.environ.get("TINYAWS_API_KEY") or None,
        exit_with_parent=args.exit_with_parent,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    log.info("%s: polling %s every %.2fs", args.node, args.scheduler, args.poll_secs)
    agent.serve_forever()
    log.info("%s: stopped", args.node)
    return 0


if __name__ == "__main__":
    sys.exit(main())
