"""The `tiny-scheduler` command line."""

from __future__ import annotations

import os
import sys

import click


@click.group()
def main() -> None:
    """tiny-scheduler: the job scheduler of a small self-hosted cloud."""


@main.command()
def serve() -> None:
    """Run the scheduler daemon (gunicorn, configured from the environment)."""
    argv = [sys.executable, "-m", "gunicorn", "-c", "python:tiny_scheduler.gunicorn_conf"]
    os.execv(sys.executable, argv)
