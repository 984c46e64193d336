"""The domain: what a job, a schedule, a queue and a node are, and the pure decisions about
them — the state machine, request checks, placement and fit, fencing. No I/O, no threads, no
clock of its own (times come in as arguments); everything above builds on these.
"""
