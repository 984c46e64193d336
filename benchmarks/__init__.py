"""The benchmark of issue 7: `make bench` (or `python -m benchmarks`) runs it.

It starts the real scheduler under gunicorn (`tiny_scheduler.dev.daemon.SchedulerProcess`) on a
real SQLite file, with the fake registry in a process of its own, and drives it from load
generator processes that speak raw HTTP/1.1 over keep-alive connections. Modules:

- `loadgen`: the load generator (an epoll loop of cheap clients per process) and its sessions;
- `history`: job histories of 10k to 1M jobs, written with the store's own code;
- `procs`: the registry process, starting and timing the scheduler, CPU and memory readings;
- `scenarios`: the four measurements of the issue;
- `report`: medians, the table (with the Go original's figures and the targets), the JSON.

Nothing here is imported by the scheduler or by the tests.
"""
