"""`python -m tiny_scheduler.cli`: the same command line as the `tiny-scheduler` script."""

from . import run

run()
