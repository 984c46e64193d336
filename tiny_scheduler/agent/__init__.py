"""The compute agent (`tiny-scheduler agent`): runs the scheduler's jobs on one node.

It polls the scheduler for the node's pending jobs, claims them, runs each in its own process
group, and reports how they ended; the wire is the tiny-aws agent protocol of `peers.md` plus
the heartbeat and live output of `api.md` ("Nodes and their agents"). The parts:

- `config`: the agent's settings, with their defaults.
- `wire`: HTTP calls to the scheduler across several URLs (leader and standbys).
- `runner`: one job's folder and owner, its output tails, stopping it with a grace.
- `owner`: the small process that owns one running job (standard library only).
- `resources`: the node's capacity (CPUs, memory, GPUs, labels) and what its jobs hold of it.
- `cgroups`: a control group per job attempt, its limits, its usage, its OOM kills.
- `groups`: the record on disk of the process groups the agent started.
- `spool`: final reports kept on disk until a scheduler acknowledges them.
- `heartbeat`: `PUT /nodes/{id}` and its reply (period, stop orders).
- `dev_registry`: registry heartbeats and services, for the dev cluster only.
- `main`: the agent itself, its threads and its slots, and its drain on SIGTERM.

It imports neither Flask nor the scheduler's server modules: a compute node runs only this.
"""
