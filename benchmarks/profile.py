"""Optional sampling profiles of the scheduler's worker during a measurement (`--profile`).

py-spy (`pip install py-spy`; not a dependency of the project) records the worker from outside
the process, without pausing it (`--nonblocking`), for the measuring window of the first run of
each case. Only the thread holding the GIL is sampled (`--gil`): one worker process runs one
thread of Python at a time, so that is where its capacity goes. Time spent with the GIL
released (in the kernel, in SQLite, waiting) is not in the profile; the `server_sys` CPU figure
in the JSON shows the kernel's part. The raw collapsed stacks go to
`results/profiles/<case>.txt` (load them into speedscope or flamegraph.pl), and `summary()`
lists where the samples fall: by the function a sample was in (self) and by every function on
its stack (inclusive).
"""

from __future__ import annotations

import collections
import math
import re
import subprocess
from pathlib import Path

SAMPLE_RATE = 1000
"""Samples per second."""

_LINE = re.compile(r":\d+\)$")


class PySpy:
    """Starts one `py-spy record` per profiled case; `finish()` waits for them all."""

    def __init__(self, executable: str, out_dir: Path) -> None:
        self.executable = executable
        self.out_dir = out_dir
        self._running: list[tuple[subprocess.Popen[bytes], Path]] = []
        out_dir.mkdir(parents=True, exist_ok=True)

    def __call__(self, pid: int, name: str, seconds: float) -> None:
        out = self.out_dir / f"{name}.txt"
        # --gil: only the thread holding the GIL is sampled, which is where a one-worker
        # server's time goes; --nonblocking: the worker is never paused.
        command = [
            self.executable, "record", "--pid", str(pid), "--duration", str(math.ceil(seconds)),
            "--rate", str(SAMPLE_RATE), "--format", "raw", "--output", str(out),
            "--nonblocking", "--gil",
        ]  # fmt: skip
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._running.append((proc, out))

    def finish(self) -> list[Path]:
        written = []
        for proc, out in self._running:
            _, err = proc.communicate(timeout=120)
            if proc.returncode != 0 or not out.exists():
                raise RuntimeError(f"py-spy failed for {out.name}: {err.decode()[-500:]}")
            written.append(out)
        self._running.clear()
        return written


_LAYERS = (
    ("tiny_scheduler/", "tiny_scheduler"),
    ("gunicorn/", "gunicorn"),
    ("flask/", "flask"),
    ("werkzeug/", "werkzeug"),
    ("logging/", "logging"),
    ("threading.py", "threads, queues, selectors"),
    ("concurrent/", "threads, queues, selectors"),
    ("queue.py", "threads, queues, selectors"),
    ("selectors.py", "threads, queues, selectors"),
    ("socket.py", "sockets"),
)

# Frames worth knowing the inclusive share of, whoever calls them.
_MARKERS = {
    "Flask.__call__": "the Flask app (routing, request/response objects, our views)",
    "Logger.access": "gunicorn's access log (formatted even though it goes nowhere)",
    "Logger._log": "logging records made (ours and gunicorn's)",
    "Writer._take_turn": "group commits (with the GIL), whichever thread commits",
    "Parser.__next__": "gunicorn parsing requests",
}


def summary(path: Path, top: int = 25) -> str:
    """Where the samples of a raw py-spy profile fall: by layer (the package of the function a
    sample was in), by function (self), by marked frames and by our functions (inclusive)."""
    own: collections.Counter[str] = collections.Counter()
    layers: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = [_LINE.sub(")", frame) for frame in stack.split(";")]
        own[frames[-1]] += count
        layers[_layer(frames[-1])] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return f"{path.name}: no samples"

    def share(count: int) -> str:
        return f"{100 * count / total:5.1f}%"

    lines = [f"{path.name}: {total} samples with the GIL held", "  by layer (self):"]
    lines += [f"    {share(n)}  {layer}" for layer, n in layers.most_common()]
    lines.append("  marked frames (inclusive):")
    for frame, n in inclusive.most_common():
        name = frame.split(" (")[0]
        if name in _MARKERS:
            lines.append(f"    {share(n)}  {name}: {_MARKERS[name]}")
    lines.append(f"  top {top} functions (self):")
    lines += [f"    {share(n)}  {frame}" for frame, n in own.most_common(top)]
    ours = [(f, n) for f, n in inclusive.most_common() if "(tiny_scheduler/" in f]
    lines.append(f"  top {top} tiny_scheduler functions (inclusive):")
    lines += [f"    {share(n)}  {frame}" for frame, n in ours[:top]]
    return "\n".join(lines)


def _layer(frame: str) -> str:
    where = frame.rpartition(" (")[2]
    for prefix, layer in _LAYERS:
        if where.startswith(prefix):
            return layer
    return "other stdlib"
