"""`submit --cpus 4 --mem 8G --gpus 1 --on gpu=a100 --node node-c` (`cli/resources.py`), pure:
memory as Slurm writes it, each bad size's message, and the request fields the options make.
What they become on a real scheduler, and `history`'s filters, are
tests/test_cli_resources_live.py's.
"""

from __future__ import annotations

import click
import pytest

from tiny_scheduler.cli.resources import parse_memory, resource_fields

BIGGEST_MEMORY = 16_777_216  # MiB: the most a heartbeat (and a job) may say, 16T


# --- memory as Slurm writes it ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("512", 512),  # a plain number is MiB, as Slurm's --mem
        ("512M", 512),
        ("8G", 8192),
        ("8g", 8192),
        ("8GB", 8192),
        ("8GiB", 8192),
        (" 8 G ", 8192),
        ("1T", 1_048_576),
        ("16T", BIGGEST_MEMORY),
        ("2048K", 2),
        ("1K", 1),  # less than a MiB still asks for some memory: one MiB
        ("0", 0),  # no request
        ("0G", 0),
    ],
)
def test_memory_is_read_as_slurm_writes_it(text: str, mib: int) -> None:
    assert parse_memory(text) == mib


@pytest.mark.parametrize("text", ["", "8X", "-1G", "1.5G", "G", "8 GB more", "8GiBB", "8MG"])
def test_anything_else_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(click.BadParameter) as refused:
        parse_memory(text)
    assert refused.value.format_message() == (
        f"Invalid value for '--mem': {text!r} is not an amount of memory such as 512M or 8G"
    )


def test_the_options_become_the_request_fields_and_none_adds_nothing() -> None:
    assert resource_fields(4, "8G", 1, ("gpu=a100",), ("node-c",)) == {
        "cpus": 4,
        "memory_mb": 8192,
        "gpus": 1,
        "node_selector": {"gpu": "a100"},
        "node_ids": ["node-c"],
    }
    # Labels and nodes repeat or come comma-separated; an empty name between commas is none.
    assert resource_fields(None, None, None, ("gpu=a100,zone=b", "rack=r1"), ("a,b", "c,")) == {
        "node_selector": {"gpu": "a100", "zone": "b", "rack": "r1"},
        "node_ids": ["a", "b", "c"],
    }
    # Nothing asked: the request is exactly an old client's.
    assert resource_fields(None, None, None, (), ()) == {}
    with pytest.raises(click.BadParameter) as refused:
        resource_fields(None, None, None, ("gpu",), ())
    assert refused.value.format_message() == "Invalid value for '--on': 'gpu' is not NAME=VALUE"
