"""What the agent polls were offered in the last few seconds (`OFFER_HOLD_SECS`).

A job that appeared in its own node's poll answer may be about to be claimed by that node's
agent; moving it to another node meanwhile would hand one job to two agents' hands (the claim
would lose, but the agent would have started to work on it). So the poll remembers what it
offered, and moving work asks before it takes a job.

Memory holds only the offers of the last `hold_us` microseconds: each remembering forgets the
older ones, oldest first. Not thread-safe by itself: the job table calls it under its lock, in
the same hold as the poll's answer or the move's choice. Tests: `tests/test_offers.py`.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from ..domain.jobs import Job


class Offers:
    """seq -> (node, when) of the jobs offered to agents lately."""

    def __init__(self, hold_us: int) -> None:
        self._hold_us = hold_us
        self._offers: dict[int, tuple[str, int]] = {}
        # The same offers in the order they were made, so forgetting pops from the front.
        self._log: collections.deque[tuple[int, int]] = collections.deque()

    def remember(self, node_id: str, answer: Iterable[Job], now: int) -> None:
        """The jobs of `answer` were handed to `node_id`'s agent at `now`."""
        self._forget(now - self._hold_us)
        for job in answer:
            self._offers[job.seq] = (node_id, now)
            self._log.append((now, job.seq))

    def held(self, job: Job, now: int) -> bool:
        """Whether the job was offered to its own node within the hold before `now`. An
        offer to another node (before a move or a retry) does not hold it where it is."""
        offer = self._offers.get(job.seq)
        return offer is not None and offer[0] == job.node_id and offer[1] > now - self._hold_us

    def __len__(self) -> int:
        return len(self._offers)

    def _forget(self, since: int) -> None:
        """Drop offers made at or before `since`."""
        log = self._log
        while log and log[0][0] <= since:
            at, seq = log.popleft()
            offer = self._offers.get(seq)
            if offer is not None and offer[1] == at:
                del self._offers[seq]
