"""The dashboard's line about the daemons: which one you are on and its role, the leader, and
each standby with how long ago it was last seen, and `gone` for one not seen for longer than a
running daemon ever goes.

A standby forwards the dashboard to the leader like any request (`api/forward.py`), adding
`X-Forwarded-By` with its own URL: so the page, rendered by the leader, can still say that
you are on a standby, and which.
"""

from __future__ import annotations

import dataclasses

from ..service import Scheduler


@dataclasses.dataclass(frozen=True, slots=True)
class DaemonRow:
    url: str
    role: str
    seen_us: int  # when last seen, by this machine's clock (for the page's relative times)
    here: bool  # the daemon the browser talks to
    alive: bool = True  # False: not seen for longer than a running daemon ever goes


@dataclasses.dataclass(frozen=True, slots=True)
class Daemons:
    here_url: str
    here_role: str
    leader: str | None
    epoch: int
    rows: list[DaemonRow]
    now: int


def daemons(service: Scheduler, forwarded_by: str | None, own_url: str) -> Daemons:
    """The daemons as this daemon knows them; `forwarded_by` is the standby the request came
    through, if any; `own_url` this daemon's URL as the browser reached it."""
    view = service.terms.cluster(own_url)
    now = service.clock.now_us()
    own = service.settings.advertise_url or own_url
    here = forwarded_by or own
    rows = [
        DaemonRow(d.url, d.role, now - int(d.seen_secs_ago * 1e6), d.url == here, d.alive)
        for d in view.daemons
    ]
    role = "standby" if forwarded_by else "leader"
    return Daemons(here, role, view.leader, view.epoch, rows, now)
