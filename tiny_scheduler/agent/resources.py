"""What this node has and what its jobs hold of it: CPUs, memory, GPUs and labels.

The node's **capacity** is its CPUs (the agent's slots), its memory (MiB, from `/proc/meminfo`
unless `--memory-mb` says), its GPUs (the count of `/dev/nvidia[0-9]*` unless `--gpus` says)
and its labels (`--label k=v`). The **ledger** keeps what the running jobs hold of it, each
job's **grant**: a `run` job holds `max(cpus, 1)` CPUs (a job without a request is one CPU, as
on the scheduler's side), a service none; both hold their `memory_mb` and `gpus`, the GPUs by
index (the lowest free ones, kept for the job until it ends, across an agent restart: the
grant is in the job's folder). The agent claims a job only when it fits in what is free, so
even a scheduler that does not count resources cannot overfill the node: a job that does not
fit stays pending and is offered again.

Pure but for the two detections (`detect_memory_mb`, `detect_gpus`), which read the files
they are given. Tests: `tests/test_agent_resources.py`.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from collections.abc import Iterable, Mapping

MAX_MEMORY_MB = 16_777_216
MAX_GPUS = 64
MAX_LABELS = 64
MAX_LABEL_TEXT = 63
"""The bounds the scheduler puts on a heartbeat's `memory_mb`, `gpus` and `labels`."""

_GPU_DEVICE = re.compile(r"nvidia[0-9]+")


@dataclasses.dataclass(frozen=True)
class Need:
    """What a job takes from the node while it runs."""

    cpus: int = 0
    memory_mb: int = 0
    gpus: int = 0

    @classmethod
    def of(cls, cpus: int, memory_mb: int, gpus: int, is_service: bool) -> Need:
        """A job's need from its request: a `run` job takes at least one CPU, a service none
        (as it takes no slot); both take their memory and GPUs."""
        return cls(0 if is_service else max(cpus, 1), max(memory_mb, 0), max(gpus, 0))


@dataclasses.dataclass(frozen=True)
class Capacity:
    """What the node offers. `memory_mb` 0: unknown, so memory is not counted."""

    cpus: int
    memory_mb: int = 0
    gpus: int = 0
    labels: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Grant:
    """What one running job holds: its need, and which GPUs (by index)."""

    need: Need
    gpu_indexes: tuple[int, ...] = ()


class Ledger:
    """What the node's running jobs hold, by job id. Not thread-safe: the agent holds its
    lock around it."""

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self._grants: dict[str, Grant] = {}

    def free(self) -> Need:
        """What is left (below zero when adopted jobs hold more than the node now has)."""
        held = list(self._grants.values())
        return Need(
            self.capacity.cpus - sum(g.need.cpus for g in held),
            self.capacity.memory_mb - sum(g.need.memory_mb for g in held),
            self.capacity.gpus - sum(g.need.gpus for g in held),
        )

    def shortfall(self, need: Need) -> str:
        """Why `need` does not fit in what is free now ("" when it fits)."""
        free = self.free()
        short = []
        if need.cpus > free.cpus:
            short.append(f"{need.cpus} cpus ({max(free.cpus, 0)} free)")
        if self.capacity.memory_mb and need.memory_mb > free.memory_mb:
            short.append(f"{need.memory_mb} MiB ({max(free.memory_mb, 0)} free)")
        if need.gpus > free.gpus:
            short.append(f"{need.gpus} gpus ({max(free.gpus, 0)} free)")
        return ", ".join(short)

    def take(self, job_id: str, need: Need) -> Grant | None:
        """Hold `need` for the job, with the lowest free GPU indexes; None when it does not
        fit now (nothing is held then)."""
        if self.shortfall(need):
            return None
        indexes = choose_gpus(need.gpus, self.capacity.gpus, self._gpus_in_use())
        assert indexes is not None  # the count fits, so the indexes do
        grant = Grant(need, indexes)
        self._grants[job_id] = grant
        return grant

    def restore(self, job_id: str, grant: Grant) -> None:
        """Hold what a job an earlier run of the agent started holds, fit or not: it runs."""
        self._grants[job_id] = grant

    def give_back(self, job_id: str) -> None:
        self._grants.pop(job_id, None)

    def _gpus_in_use(self) -> set[int]:
        return {index for grant in self._grants.values() for index in grant.gpu_indexes}


def choose_gpus(count: int, total: int, in_use: Iterable[int]) -> tuple[int, ...] | None:
    """The `count` lowest GPU indexes of `0…total-1` not in use; None when too few are free.
    An index in use stays its job's until that job ends, so two jobs never share a GPU."""
    busy = set(in_use)
    free = [index for index in range(total) if index not in busy]
    if count > len(free):
        return None
    return tuple(free[:count])


def job_environment(cpus: int, memory_mb: int, grant: Grant, node_gpus: int) -> dict[str, str]:
    """The variables a job finds about what it was given: `TINY_CPUS` (its request, 1 when
    unset), `TINY_MEMORY_MB` (0: no limit), `TINY_GPUS`, and on a node with GPUs
    `CUDA_VISIBLE_DEVICES` naming its own (empty for a job that asked for none, so that it
    cannot take another job's)."""
    env = {
        "TINY_CPUS": str(max(cpus, 1)),
        "TINY_MEMORY_MB": str(max(memory_mb, 0)),
        "TINY_GPUS": str(len(grant.gpu_indexes)),
    }
    if node_gpus or grant.gpu_indexes:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(index) for index in grant.gpu_indexes)
    return env


def parse_label(text: str) -> tuple[str, str]:
    """`key=value` as a label; ValueError saying what is wrong."""
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    if not sep or not key:
        raise ValueError(f"{text!r} is not KEY=VALUE")
    if len(key) > MAX_LABEL_TEXT or len(value) > MAX_LABEL_TEXT:
        raise ValueError(f"{text!r}: a label's key and value are at most {MAX_LABEL_TEXT} long")
    return key, value


def labels_of(texts: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """The labels `--label` gave, a later one of the same key winning; ValueError for a bad
    one or too many."""
    found: dict[str, str] = {}
    for text in texts:
        key, value = parse_label(text)
        found[key] = value
    if len(found) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels, not {len(found)}")
    return tuple(sorted(found.items()))


def memory_mb_of(meminfo: str) -> int:
    """`MemTotal` of a `/proc/meminfo` text in MiB (0 when it has none), within the bound
    the scheduler takes."""
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemTotal":
            fields = rest.split()
            if fields and fields[0].isdigit():
                kib = int(fields[0])
                return min(kib // 1024, MAX_MEMORY_MB)
    return 0


def detect_memory_mb(path: str = "/proc/meminfo") -> int:
    """The machine's memory in MiB; 0 when it cannot be read (then memory is not counted)."""
    try:
        with open(path) as f:
            return memory_mb_of(f.read())
    except OSError:
        return 0


def gpus_of(device_names: Iterable[str]) -> int:
    """How many of these `/dev` names are NVIDIA GPUs (`nvidia0`, `nvidia1`, …; not
    `nvidiactl` or `nvidia-uvm`), within the bound the scheduler takes."""
    return min(sum(1 for name in device_names if _GPU_DEVICE.fullmatch(name)), MAX_GPUS)


def detect_gpus(dev: str = "/dev") -> int:
    return gpus_of(os.path.basename(path) for path in glob.glob(os.path.join(dev, "nvidia*")))


def grant_to_spec(grant: Grant) -> dict[str, object]:
    """A grant as the job's spec (in its folder) keeps it, for a restarted agent."""
    need = grant.need
    return {
        "cpus": need.cpus,
        "memory_mb": need.memory_mb,
        "gpus": need.gpus,
        "gpu_indexes": list(grant.gpu_indexes),
    }


def grant_from_spec(held: object, is_service: bool) -> Grant:
    """The grant a job's spec kept; for a spec without one (a job started by an agent from
    before resources), or of a wrong shape, what such a job held then: one CPU for a `run`
    job, nothing for a service."""
    if not isinstance(held, Mapping):
        return Grant(Need.of(0, 0, 0, is_service))

    def count(name: str) -> int:
        value = held.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    indexes = held.get("gpu_indexes")
    gpus = (
        tuple(i for i in indexes if isinstance(i, int) and not isinstance(i, bool))
        if isinstance(indexes, list)
        else ()
    )
    return Grant(Need(count("cpus"), count("memory_mb"), count("gpus")), gpus)
