"""The agent's side of fit (`agent/resources.py`): what a job takes, what is free, which GPUs
it gets, the variables it finds, and what the node detects of itself. Pure: no process."""

from __future__ import annotations

import pytest

from tiny_scheduler.agent import resources
from tiny_scheduler.agent.protocol import parse_poll_reply
from tiny_scheduler.agent.resources import Capacity, Grant, Ledger, Need


def test_a_run_job_takes_at_least_one_cpu_and_a_service_none() -> None:
    assert Need.of(0, 0, 0, is_service=False) == Need(1, 0, 0)  # an old job: one CPU
    assert Need.of(4, 512, 1, is_service=False) == Need(4, 512, 1)
    assert Need.of(4, 512, 1, is_service=True) == Need(0, 512, 1)  # memory and GPUs all the same


def test_a_job_is_taken_only_while_it_fits_and_its_share_comes_back() -> None:
    ledger = Ledger(Capacity(cpus=4, memory_mb=1000, gpus=0))
    assert ledger.take("job-1", Need(3, 600, 0)) == Grant(Need(3, 600, 0))
    assert ledger.shortfall(Need(2, 0, 0)) == "2 cpus (1 free)"
    assert ledger.take("job-2", Need(2, 0, 0)) is None
    assert ledger.shortfall(Need(1, 500, 0)) == "500 MiB (400 free)"
    assert ledger.take("job-3", Need(1, 500, 0)) is None
    assert ledger.shortfall(Need(0, 0, 1)) == "1 gpus (0 free)"
    # Nothing was held by the refusals: exactly what is left fits.
    assert ledger.take("job-4", Need(1, 400, 0)) is not None
    assert ledger.free() == Need(0, 0, 0)
    ledger.give_back("job-1")
    assert ledger.free() == Need(3, 600, 0)
    assert ledger.take("job-2", Need(2, 0, 0)) is not None


def test_a_service_fits_on_a_node_whose_cpus_are_all_taken() -> None:
    ledger = Ledger(Capacity(cpus=1, memory_mb=100))
    assert ledger.take("job-1", Need.of(1, 0, 0, is_service=False)) is not None
    assert ledger.take("job-2", Need.of(0, 50, 0, is_service=True)) is not None
    assert ledger.take("job-3", Need.of(0, 60, 0, is_service=True)) is None  # its memory


def test_a_node_of_unknown_memory_does_not_count_memory() -> None:
    ledger = Ledger(Capacity(cpus=2, memory_mb=0))
    assert ledger.take("job-1", Need(1, 10_000, 0)) is not None


def test_jobs_running_at_once_get_distinct_gpus_and_a_freed_one_is_reused() -> None:
    ledger = Ledger(Capacity(cpus=8, gpus=4))
    first = ledger.take("job-1", Need(1, 0, 1))
    second = ledger.take("job-2", Need(1, 0, 2))
    assert first is not None and second is not None
    assert (first.gpu_indexes, second.gpu_indexes) == ((0,), (1, 2))
    assert ledger.take("job-3", Need(1, 0, 2)) is None  # one left
    ledger.give_back("job-1")
    third = ledger.take("job-3", Need(1, 0, 2))
    assert third is not None and third.gpu_indexes == (0, 3)


def test_an_adopted_job_keeps_its_gpus_even_past_what_the_node_now_has() -> None:
    # A restarted agent with fewer GPUs: the running job keeps its own, and nothing new fits.
    ledger = Ledger(Capacity(cpus=4, gpus=1))
    ledger.restore("job-1", Grant(Need(1, 0, 2), (0, 1)))
    assert ledger.free() == Need(3, 0, -1)
    assert ledger.take("job-2", Need(1, 0, 1)) is None
    assert ledger.shortfall(Need(1, 0, 1)) == "1 gpus (0 free)"


def test_gpu_indexes_are_the_lowest_free_ones() -> None:
    assert resources.choose_gpus(2, 4, {0, 2}) == (1, 3)
    assert resources.choose_gpus(0, 0, set()) == ()
    assert resources.choose_gpus(3, 4, {1, 2}) is None


def test_a_grant_survives_the_spec_and_an_old_spec_means_one_cpu() -> None:
    grant = Grant(Need(2, 256, 2), (1, 3))
    assert resources.grant_from_spec(resources.grant_to_spec(grant), False) == grant
    assert resources.grant_from_spec(None, is_service=False) == Grant(Need(1, 0, 0))
    assert resources.grant_from_spec(None, is_service=True) == Grant(Need(0, 0, 0))
    odd = {"cpus": True, "memory_mb": "8", "gpus": 1, "gpu_indexes": [2, "x"]}
    assert resources.grant_from_spec(odd, False) == Grant(Need(0, 0, 1), (2,))


def test_the_job_environment_says_what_it_was_given() -> None:
    env = resources.job_environment(0, 0, Grant(Need(1, 0, 0)), node_gpus=0)
    assert env == {"TINY_CPUS": "1", "TINY_MEMORY_MB": "0", "TINY_GPUS": "0"}
    env = resources.job_environment(4, 2048, Grant(Need(4, 2048, 2), (1, 3)), node_gpus=4)
    assert env == {
        "TINY_CPUS": "4",
        "TINY_MEMORY_MB": "2048",
        "TINY_GPUS": "2",
        "CUDA_VISIBLE_DEVICES": "1,3",
    }
    # On a node with GPUs a job that asked for none sees none (it cannot take another's).
    env = resources.job_environment(1, 0, Grant(Need(1, 0, 0)), node_gpus=2)
    assert env["CUDA_VISIBLE_DEVICES"] == ""


def test_labels_are_key_value_pairs_within_the_schedulers_bounds() -> None:
    assert resources.labels_of(["gpu=a100", "zone = b", "gpu=h100", "empty="]) == (
        ("empty", ""),
        ("gpu", "h100"),
        ("zone", "b"),
    )
    for bad, message in (
        ("gpu", "'gpu' is not KEY=VALUE"),
        ("=a100", "'=a100' is not KEY=VALUE"),
        ("k" * 64 + "=v", "at most 63 long"),
    ):
        with pytest.raises(ValueError, match=message):
            resources.labels_of([bad])
    with pytest.raises(ValueError, match="at most 64 labels, not 65"):
        resources.labels_of([f"k{n}=v" for n in range(65)])


def test_memory_and_gpus_are_detected_from_the_machines_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    meminfo = "MemTotal:       24683664 kB\nMemFree:         1000 kB\n"
    assert resources.memory_mb_of(meminfo) == 24683664 // 1024
    assert resources.memory_mb_of("MemFree: 1 kB\n") == 0
    assert resources.memory_mb_of("MemTotal: 99999999999999 kB\n") == resources.MAX_MEMORY_MB
    assert resources.detect_memory_mb(str(tmp_path / "none")) == 0
    for name in ("nvidia0", "nvidia1", "nvidia12", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (tmp_path / name).touch()
    assert resources.detect_gpus(str(tmp_path)) == 3
    assert resources.gpus_of(f"nvidia{n}" for n in range(100)) == resources.MAX_GPUS


def test_the_poll_reply_carries_what_a_job_needs_read_leniently() -> None:
    body = (
        b'[{"job_id":"job-1","command":"x","cpus":4,"memory_mb":512,"gpus":1},'
        b'{"job_id":"job-2","command":"y","cpus":"4","memory_mb":-1,"gpus":true}]'
    )
    first, second = parse_poll_reply(body)
    assert (first.cpus, first.memory_mb, first.gpus) == (4, 512, 1)
    assert (second.cpus, second.memory_mb, second.gpus) == (0, 0, 0)
