"""What if? The cluster's own history replayed under other nodes, placement or limits (issue 38).

`tiny-scheduler simulate` reads the finished jobs of a window (`history`: from the daemon's
SQLite file opened read-only, from PostgreSQL, or from a running scheduler's `GET /jobs`),
applies the operator's changes (`changes`: other nodes, another placement, queue and user
limits, another claim latency), replays the jobs event by event on a virtual clock through
the real service in memory (`replay`: the same placement, fit, backfill, priorities, queue
limits, user limits, fair share and dependencies as the daemon), and sets what happened beside
what would have happened (`report`). The benchmarks replay their traces through the same code.

Like `create_app` and the decision tests' harness, `replay` wires a scheduler together itself
(a `MemoryStore`, a `ManualClock`, nodes from heartbeats); nothing here runs in the daemon.
"""
