"""What one daemon holds in memory: the job table and its indexes, the schedules, and the
numbered window of recent changes. Each structure keeps itself consistent under its own lock;
which change to make is decided above (the service) and in the domain below.
"""
