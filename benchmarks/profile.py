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

SAMPLE_RATE = 250
"""Samples per second."""

_LOCATION = re.compile(r" \((.*):\d+\)$")


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


def summary(path: Path, top: int = 20) -> str:
    """The functions holding the most samples in a raw py-spy profile, self and inclusive."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = [_short(frame) for frame in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return f"{path.name}: no samples"
    lines = [f"{path.name}: {total} busy samples"]
    for title, counter in (("self", own), ("inclusive", inclusive)):
        lines.append(f"  top {top} by {title}:")
        for frame, count in counter.most_common(top):
            lines.append(f"    {100 * count / total:5.1f}%  {frame}")
    return "\n".join(lines)


def _short(frame: str) -> str:
    """`func (path/to/module.py:12)` -> `func (module.py)`: lines merged, paths shortened."""
    match = _LOCATION.search(frame)
    if not match:
        return frame
    where = match.group(1)
    parts = where.split("/")
    if "site-packages" in parts:
        where = "/".join(parts[parts.index("site-packages") + 1 :])
    elif "tiny_scheduler" in parts:
        where = "/".join(parts[parts.index("tiny_scheduler") :])
    else:
        where = parts[-1]
    return f"{frame[: match.start()]} ({where})"
