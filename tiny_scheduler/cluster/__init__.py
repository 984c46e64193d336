"""The cluster around one daemon: where the compute nodes come from (the tiny-aws registry or
the agents' own heartbeats), the calls to peers, and leadership among daemons that share a
PostgreSQL database (lease, epoch, fence).
"""
