"""The local dev cluster: stand-ins for the registry, SQS and SNS, and the agent protocol.

Real HTTP servers on loopback that follow `peers.md`, used by `tiny-scheduler dev`, by
`make demo`, by the tests and by the benchmark. Not imported by the scheduler itself.
"""
