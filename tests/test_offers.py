"""`state/offers.py`: what the agent polls offered lately holds a job where it is, for the hold
and no longer, and only on the node it was offered to."""

from __future__ import annotations

from test_table import T0, make

from tiny_scheduler.state.offers import Offers

HOLD = 10_000_000


def test_an_offer_holds_its_job_for_the_hold_and_no_longer() -> None:
    offers = Offers(HOLD)
    job = make(1, "node-a")
    assert not offers.held(job, T0)
    offers.remember("node-a", [job], T0)
    assert offers.held(job, T0 + HOLD - 1)
    assert not offers.held(job, T0 + HOLD)


def test_an_offer_to_another_node_does_not_hold_the_job_where_it_is() -> None:
    offers = Offers(HOLD)
    offers.remember("node-b", [make(1, "node-b")], T0)  # then the job moved to node-a
    assert not offers.held(make(1, "node-a"), T0 + 1)


def test_a_newer_offer_renews_the_hold_and_old_ones_are_forgotten() -> None:
    offers = Offers(HOLD)
    job = make(1, "node-a")
    offers.remember("node-a", [job], T0)
    offers.remember("node-a", [job], T0 + HOLD // 2)
    offers.remember("node-a", [make(2)], T0 + HOLD)  # forgets the first, not the renewal
    assert offers.held(job, T0 + HOLD + 1)
    for n in range(100):
        offers.remember("node-a", [make(3 + n)], T0 + (2 + n) * HOLD)
    assert len(offers) == 1  # the memory holds the last hold's offers only
