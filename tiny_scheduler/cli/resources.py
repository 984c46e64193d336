"""`submit --cpus 4 --mem 8G --gpus 1 --on gpu=a100 --node node-c`: the options that say what a
job needs and where it may run, and what they become in a job request (`cpus`, `memory_mb`,
`gpus`, `node_selector`, `node_ids`). Memory is written as Slurm writes it: a number of MiB, or
with a unit, `512M`, `8G`, `1T` (powers of 1024). A module of its own, so that `submit` gains
one decorator and one line.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

_MEMORY = re.compile(r"(\d+)\s*([KMGT]?)(?:i?B)?", re.IGNORECASE)
_UNIT_MIB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}
_NAMES = ("cpus", "mem", "gpus", "on", "nodes")


def parse_memory(text: str) -> int:
    """MiB in `512`, `512M`, `8G`, `8GB`, `1T`, `2048K`; BadParameter otherwise."""
    found = _MEMORY.fullmatch(text.strip())
    if found is None:
        raise click.BadParameter(
            f"{text!r} is not an amount of memory such as 512M or 8G", param_hint="'--mem'"
        )
    amount = int(found.group(1)) * _UNIT_MIB[found.group(2).upper()]
    return max(1, int(amount)) if amount else 0


def _labels(pairs: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        for part in pair.split(","):
            name, sep, value = part.partition("=")
            if not sep or not name.strip():
                raise click.BadParameter(f"{part!r} is not NAME=VALUE", param_hint="'--on'")
            labels[name.strip()] = value.strip()
    return labels


def resource_options(command: F) -> F:
    """The options for `submit`, handed to it as one `resources` dict of JobRequest fields
    (empty when none is given)."""

    @functools.wraps(command)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in _NAMES}
        return command(*args, resources=resource_fields(**given), **kwargs)

    options = [
        click.option(
            "--node",
            "nodes",
            multiple=True,
            metavar="NODE[,NODE...]",
            help="Run only on these nodes (repeat, or comma-separated; Slurm's --nodelist).",
        ),
        click.option(
            "--on",
            multiple=True,
            metavar="LABEL=VALUE",
            help="Run only on a node with this label (repeat for several: all must match).",
        ),
        click.option("--gpus", type=click.IntRange(0, 64), help="GPUs the job needs."),
        click.option(
            "--mem",
            metavar="SIZE",
            help="Memory the job needs and may use: MiB, or 512M, 8G (the node enforces it).",
        ),
        click.option(
            "--cpus", type=click.IntRange(1, 1024), help="CPUs the job needs (default 1)."
        ),
    ]
    for option in options:
        wrapped = option(wrapped)
    return wrapped  # type: ignore[return-value]


def resource_fields(
    cpus: int | None,
    mem: str | None,
    gpus: int | None,
    on: tuple[str, ...],
    nodes: tuple[str, ...],
) -> dict[str, Any]:
    """The JobRequest fields for the options given (none when none is)."""
    fields: dict[str, Any] = {}
    if cpus is not None:
        fields["cpus"] = cpus
    if mem is not None:
        fields["memory_mb"] = parse_memory(mem)
    if gpus is not None:
        fields["gpus"] = gpus
    if on:
        fields["node_selector"] = _labels(on)
    names = [name.strip() for group in nodes for name in group.split(",") if name.strip()]
    if names:
        fields["node_ids"] = names
    return fields
