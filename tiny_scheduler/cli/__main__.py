"""`python -m tiny_scheduler.cli`: the same command line as the `tiny-scheduler` script."""

from . import main

main(prog_name="tiny-scheduler")
