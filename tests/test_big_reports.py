"""The agent's final report always lands, whatever the size of its output: the real daemon
under gunicorn takes a 100 MB report (and one of 700,000 control characters, 6 bytes each on
the wire), keeps the tails of stdout and stderr behind the truncation marker, and its worker's
memory grows by no more than the issue's bound while it reads (peak resident size, from the
worker's /proc)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import SchedulerFactory
from helpers import Agent, Api, expect_json

from tiny_scheduler.config import DEFAULT_MAX_OUTPUT_BYTES
from tiny_scheduler.dev.daemon import SchedulerProcess, memory_bytes, reset_peak_memory

CAP = DEFAULT_MAX_OUTPUT_BYTES
MB = 1_000_000
READING_BOUND = 3 * CAP + 20 * 1024 * 1024
"""The issue's bound on the worker's growth while it reads one report."""

MARKER = re.compile(r"\[tiny-scheduler: output truncated, (\d+) earlier bytes dropped\]\n")


class Body(io.RawIOBase):
    """A request body made of parts (bytes, or (bytes, count) repeated), produced as it is
    read, so that the test never holds 100 MB either; its length is known up front."""

    def __init__(self, *parts: bytes | tuple[bytes, int]) -> None:
        self._parts = [(part, 1) if isinstance(part, bytes) else part for part in parts]
        self._length = sum(len(data) * count for data, count in self._parts)
        self._pieces = self._generate()
        self._pending = b""

    def __len__(self) -> int:
        return self._length

    def _generate(self) -> Iterator[bytes]:
        for data, count in self._parts:
            for _ in range(count):
                yield data

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            self._pending = next(self._pieces, b"")
            if not self._pending:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def field(name: str, first: bool = False) -> bytes:
    return (b"{" if first else b",") + json.dumps(name).encode() + b":"


def check_capped(kept: str, block: str, total: int) -> None:
    """`kept` is the capped form of `block` repeated up to `total` UTF-8 bytes: the marker
    counting what was dropped, then the text's very end, within CAP bytes in all."""
    match = MARKER.match(kept)
    assert match, kept[:200]
    tail = kept[match.end() :].encode()
    assert len(kept.encode()) <= CAP
    assert int(match.group(1)) + len(tail) <= total  # a character cut in two is dropped whole
    assert total - int(match.group(1)) - len(tail) < 4
    whole_blocks = (block * (len(tail) // len(block.encode()) + 2)).encode()
    assert whole_blocks.endswith(tail)


@pytest.fixture
def daemon(scheduler_factory: SchedulerFactory) -> SchedulerProcess:
    """A scheduler of the test's own: no other test's memory in its figures."""
    return scheduler_factory()


def claimed_job(daemon: SchedulerProcess, node: str) -> tuple[Agent, str]:
    agent = Agent(daemon.url, node)
    job_id = Api(daemon.url).submit(command="make noise")["job_id"]
    expect_json(agent.claim(job_id), 200)
    return agent, job_id


def warmed_up(daemon: SchedulerProcess, node: str) -> int:
    """Let the worker take one ordinary report first (first-use costs are no growth), then
    start its peak afresh; the worker's pid."""
    agent, job_id = claimed_job(daemon, node)
    expect_json(agent.report(job_id, 0, stdout="x" * CAP * 2, stderr="warm"), 200)
    agent.close()
    pid = daemon.worker_pid
    reset_peak_memory(pid)
    return pid


def test_a_100_mb_report_is_accepted_and_read_in_bounded_memory(
    daemon: SchedulerProcess, node: str
) -> None:
    pid = warmed_up(daemon, node)
    agent, job_id = claimed_job(daemon, node)
    # Lines with escapes, non-ASCII characters and a 4-byte one, as real output has.
    out_block = "".join(f'line {n:05d}: é ✓ 🚀 "quoted" \\ tab\t\n' for n in range(1000))
    err_block = "warning: something odd\n" * 2000
    out_wire = json.dumps(out_block)[1:-1].encode()
    err_wire = json.dumps(err_block)[1:-1].encode()
    out_count = 60 * MB // len(out_wire) + 1
    err_count = 40 * MB // len(err_wire) + 1
    body = Body(
        field("status", first=True) + b'"done"' + field("exit_code") + b"0" + field("stdout"),
        b'"',
        (out_wire, out_count),
        b'"' + field("stderr") + b'"',
        (err_wire, err_count),
        b'"}',
    )
    assert len(body) > 100 * MB
    before = memory_bytes(pid, "VmRSS")

    reply = agent.api.request("PATCH", f"/jobs/{job_id}", data=body, timeout=60)

    growth = memory_bytes(pid, "VmHWM") - before
    print(f"a {len(body) / MB:.0f} MB report grew the worker's peak RSS by {growth / MB:.1f} MB")
    done = expect_json(reply, 200)
    assert (done["status"], done["exit_code"]) == ("done", 0)
    check_capped(done["stdout"], out_block, out_count * len(out_block.encode()))
    check_capped(done["stderr"], err_block, err_count * len(err_block.encode()))
    assert agent.api.job(job_id) == done
    assert growth < READING_BOUND, f"the worker grew by {growth / MB:.1f} MB while reading"
    agent.close()


def test_700_000_control_characters_are_kept_whole(daemon: SchedulerProcess, node: str) -> None:
    """6 bytes each on the wire: 4.2 MB, over MAX_REQUEST_BYTES, for 700 KB of output."""
    pid = warmed_up(daemon, node)
    agent, job_id = claimed_job(daemon, node)
    noise = "".join(chr(n % 8) for n in range(700_000))  # all \\u00XX on the wire
    body = json.dumps({"status": "failed", "exit_code": 1, "stdout": "", "stderr": noise})
    assert len(body) > 4_194_304
    before = memory_bytes(pid, "VmRSS")

    failed = expect_json(agent.api.patch(f"/jobs/{job_id}", body), 200)

    growth = memory_bytes(pid, "VmHWM") - before
    print(f"700,000 control characters grew the worker's peak RSS by {growth / MB:.1f} MB")
    assert failed["status"] == "pending"  # retried: the attempt keeps what it printed
    assert failed["retry_count"] == 1
    assert agent.api.job(job_id)["attempts"][0]["stderr"] == noise
    assert growth < READING_BOUND, f"the worker grew by {growth / MB:.1f} MB while reading"
    agent.close()


def test_a_big_report_sent_in_chunks_lands_too(daemon: SchedulerProcess, node: str) -> None:
    """No Content-Length (Transfer-Encoding: chunked): read to its end all the same."""
    agent, job_id = claimed_job(daemon, node)
    line = b"0123456789" * 10 + b"\\n"
    count = 20 * MB // (len(line) * 100)

    def chunks() -> Iterator[bytes]:
        yield b'{"status":"done","exit_code":0,"stdout":"'
        for _ in range(count):
            yield line * 100
        yield b'"}'

    reply = agent.api.request("PATCH", f"/jobs/{job_id}", data=chunks(), timeout=60)
    done = expect_json(reply, 200)
    block = "0123456789" * 10 + "\n"
    check_capped(done["stdout"], block, count * 100 * len(block))
    agent.close()
