"""Paging never skips a job: a reader that follows `Link` pages (and later continues after the
last job it saw) while others submit sees every job, each once, in id order.

Ids are handed out before the commit, so without care job-8 can be listed while job-7 is still
being committed, and a reader continuing after job-8 never sees job-7. The scheduler under real
gunicorn, eight real clients submitting at once.
"""

from __future__ import annotations

import re
import threading

from helpers import Api, expect_json

from tiny_scheduler.dev.daemon import SchedulerProcess

SUBMITTERS = 8
JOBS_EACH = 150
PAGE = 25  # small pages: many page boundaries for a late job to fall behind
LINK = re.compile(r'<([^>]+)>; rel="next"')


def read_pages(api: Api, node: str, after: str | None) -> tuple[list[str], str | None]:
    """Follow the Link pages from `after` to the last one; the ids seen and the last id."""
    params = {"node_id": node, "limit": str(PAGE)}
    if after is not None:
        params["after"] = after
    response = api.get("/jobs", params=params)
    seen: list[str] = []
    while True:
        seen += [job["job_id"] for job in expect_json(response, 200)]
        link = response.headers.get("Link")
        if link is None:
            break
        match = LINK.fullmatch(link)
        assert match, link
        response = api.get(match.group(1))
    return seen, seen[-1] if seen else after


def test_a_reader_following_link_pages_misses_no_job_while_eight_clients_submit(
    scheduler: SchedulerProcess, api: Api, node: str
) -> None:
    acknowledged: list[str] = []
    failures: list[BaseException] = []

    def submit() -> None:
        client = Api(scheduler.url)
        try:
            for n in range(JOBS_EACH):
                acknowledged.append(client.submit(command=f"echo {n}")["job_id"])
        except BaseException as exc:
            failures.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=submit) for _ in range(SUBMITTERS)]
    for thread in threads:
        thread.start()
    seen: list[str] = []
    after = None
    while True:
        # Whether the submitters were done *before* this pass: then it is the last one, and
        # everything acknowledged is already committed and must be found by it.
        finished = not any(thread.is_alive() for thread in threads)
        found, after = read_pages(api, node, after)
        seen += found
        if finished:
            break
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(acknowledged) == SUBMITTERS * JOBS_EACH
    numbers = [int(job_id.removeprefix("job-")) for job_id in seen]
    assert numbers == sorted(set(numbers)), "a job was listed twice or out of order"
    missed = sorted(set(acknowledged) - set(seen), key=lambda job_id: int(job_id[4:]))
    print(f"a reader following Link pages missed {len(missed)} of {len(acknowledged)} jobs")
    assert missed == [], f"{len(missed)} of {len(acknowledged)} jobs missed"
