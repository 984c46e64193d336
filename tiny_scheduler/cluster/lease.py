"""The leader's lease as this process counts it: pure rules on monotonic times.

The database decides who leads (`leadership`); these rules decide how long this process may
believe it still does. A renewal sent at `sent` keeps the leader serving until
`valid_until(sent)`: a fraction of the lease short of what the database granted, measured from
when the renewal was *sent* (not answered), so the leader stops before a standby may take
over, whatever the network delayed. `is_valid` is strict: at `valid_until` itself it no longer
serves.

Tests: `tests/test_decisions.py` (leases).
"""

from __future__ import annotations

VALID_FRACTION = 0.9
"""The leader serves for this fraction of the lease after sending a renewal, so that it stops
before the database's clock lets a standby take over (and clocks that run a little apart)."""

RENEW_FRACTION = 0.25
"""The leader renews every this fraction of the lease: a lost renewal or two do not cost it."""


def valid_until(sent: float, lease_secs: float) -> float:
    """Until when a lease renewed (or taken) by a call sent at `sent` lets this process serve."""
    return sent + lease_secs * VALID_FRACTION


def is_valid(now: float, until: float) -> bool:
    """Whether the lease counted valid until `until` still is at `now`."""
    return now < until


def database_reachable(now: float, last_contact: float, lease_secs: float) -> bool:
    """Whether the lease connection answered recently enough (within a lease) to call the
    database reachable."""
    return now - last_contact <= lease_secs
