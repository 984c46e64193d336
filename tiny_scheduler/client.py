"""The HTTP client of the scheduler's API (`api.md`), shared by the command line, the demo and
the agent.

`Client` calls one scheduler and turns every failure into a `ClientError` whose one-line
message says what went wrong and where: the URL that could not be reached, the job that was
not found; the scheduler's own error texts are kept verbatim. `Client.newest` lists the newest
jobs although the API pages oldest first; `wait_for_job` follows a job until it has settled.

This module owns the client side of the wire only: it prints nothing (`display.py` and the
CLI do), and it repeats no rule of the scheduler.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urljoin, urlsplit

from . import plain_http
from .display import describe, waiting_for, waiting_text
from .domain.limits import MAX_PAGE
from .domain.states import FINAL_STATUSES, JOB_ID_PREFIX, RUNNING, SERVICE
from .errors import JOB_NOT_FOUND
from .plain_http import NoAnswer

if TYPE_CHECKING:
    # requests (and urllib3 under it) is most of the command line's start-up: it is imported
    # when the first call through it goes out, so `--version`, `--help` and a plain `submit`
    # never pay for it.
    import requests

    Response = requests.Response | plain_http.Reply

DEFAULT_URL = "http://127.0.0.1:9001"
"""Where the scheduler listens unless SCHEDULER_URL says otherwise."""

HTTP_TIMEOUT = (2.0, 15.0)
"""(connect, read) seconds per request to one daemon: a submission may wait on the registry
and a commit, and with nothing else to ask, waiting for it is better than giving up."""

FAILOVER_TIMEOUT = (2.0, 4.0)
"""(connect, read) seconds per request to each of several daemons: a frozen one (SIGSTOPped,
or hung past its lease) accepts the connection in the kernel and answers nothing; past this
a call that is safe to repeat asks the next daemon at once."""

RETRY_AFTER_SECS = 10.0
"""Seconds a call keeps following the `Retry-After` of 503s that did nothing (`too many
connections`, `too many waiting requests`, `no leader`) before it reports the last one."""

WAIT_INTERVAL_SECS = 1.0
"""Seconds between two looks at a job while waiting for it."""

WAIT_UNREACHABLE_SECS = 30.0
"""Seconds a wait keeps trying while the scheduler cannot be reached (a restart) before it
gives up."""

WAIT_REMIND_SECS = 15.0
"""Seconds without any change after which a wait says again where the job stands, so that a
long wait never looks like a hang."""

EVENT_SAFETY_SECS = 5.0
"""Seconds a wait that follows the event stream goes at most without looking at the job: an
event lost on the way (a proxy, a restart) costs at most this much."""

FAILOVER_WAIT_SECS = 15.0
"""Seconds a client of several daemons (a comma-separated SCHEDULER_URL) keeps going round
them while none answers as the leader: a takeover after a hang takes the lease (5 s) and 2 s
more."""

_LOOPBACK = ("127.0.0.1", "localhost", "::1")

# Placement error texts of the wire contract (api.md, "Placement").
_INSTANCE_NOT_FOUND = "instance not found"
_REGISTRY_TEXTS = ("failed to reach registry", "failed to decode registry response")
_ROUTE_TEXTS = ("not found", "method not allowed")
"""The daemon's answers to a path it does not serve (or not for that method)."""


def base_url(text: str) -> str:
    """A scheduler's base URL as people write it; `127.0.0.1:9201`, without a scheme, means
    `http://127.0.0.1:9201`. Raises ValueError for anything that is not an http(s) URL."""
    url = text.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// or https:// URL")
    return url


def base_urls(text: str) -> list[str]:
    """Several daemons' base URLs, comma-separated (a leader and its standbys), each as
    `base_url` reads it; raises ValueError for one that is not an http(s) URL."""
    return [base_url(part) for part in text.split(",") if part.strip()]


def _is_no_leader(response: Response) -> bool:
    """A standby's answer while no leader is known (a takeover under way)."""
    return response.text.strip() == "no leader"


def session(url: str, key: str | None = None) -> requests.Session:
    """A `requests` session for one tiny-aws service at `url`, sending `key` as the bearer
    token when there is one."""
    import requests

    made = requests.Session()
    # A proxy from the environment has no business relaying calls to this machine.
    made.trust_env = urlsplit(url).hostname not in _LOOPBACK
    if key:
        made.headers["Authorization"] = f"Bearer {key}"
    return made


class ClientError(Exception):
    """A call to the scheduler failed; `message` says what and where, in one line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ApiError(ClientError):
    """The scheduler answered with an error status. `text` is its own message (verbatim, or
    with the id it is about added); `context`, when given, says what the text leaves out."""

    def __init__(
        self, status: int, text: str, context: str = "", retry_after: float | None = None
    ) -> None:
        super().__init__(f"{text} ({context})" if context else text)
        self.status = status
        self.text = text
        self.context = context
        self.retry_after = retry_after  # a 503's Retry-After: nothing was done, ask then

    def about(self, text: str) -> ApiError:
        """The same error with a text that names what it is about."""
        return ApiError(self.status, text, self.context, self.retry_after)


class Unreachable(ClientError):
    """No answer from the scheduler (down, wrong address, or too slow)."""


class Client:
    """A small client of the scheduler's HTTP API; every failure is a ClientError.

    `url` may list several daemons, comma-separated (PostgreSQL: a leader and its standbys):
    a call goes to each in turn until one is reached, a standby's 307 is followed to the
    leader with the key (requests would drop it on the way to another port), and while none
    leads (a takeover) the list is tried again for up to FAILOVER_WAIT_SECS. Each daemon then
    gets FAILOVER_TIMEOUT: one that accepted the connection but does not answer (frozen) is
    left for the next at once, if the call is safe to repeat (a read, or a submission, which
    always carries an Idempotency-Key, the same on every daemon: `submit`).

    A 503 that says nothing was done and when to come back (`Retry-After`: too many
    connections, too many waiting requests, no leader) is followed for up to RETRY_AFTER_SECS,
    each wait a little longer than asked so that many clients do not come back at once.
    """

    def __init__(self, url: str, key: str | None = None, plain: bool = False) -> None:
        self.base_urls = [part.strip().rstrip("/") for part in url.split(",") if part.strip()]
        self.base_url = self.base_urls[0] if self.base_urls else DEFAULT_URL
        self.key = key
        # `plain`: calls go through `plain_http` where it can carry them (a quick command's
        # start-up is mostly the import of `requests`); through `requests` otherwise.
        self.plain = plain and all(map(plain_http.usable_for, self.base_urls or [self.base_url]))
        self._session: requests.Session | None = None

    @property
    def session(self) -> requests.Session:
        """The `requests` session of the calls `plain_http` does not carry, made on first use."""
        if self._session is None:
            self._session = session(self.base_url, self.key)
        return self._session

    def request(self, method: str, path: str, **kwargs: Any) -> Response:
        """One call; a reply that is not 2xx is an ApiError, no reply at all Unreachable."""
        several = len(self.base_urls) > 1
        kwargs.setdefault("timeout", FAILOVER_TIMEOUT if several else HTTP_TIMEOUT)
        # False: a 503's Retry-After is the caller's to follow (job_events, which polls
        # meanwhile); it comes with the ApiError.
        follow = kwargs.pop("follow_retry_after", True)
        repeatable = method in ("GET", "HEAD") or "Idempotency-Key" in (kwargs.get("headers") or {})
        now = time.monotonic()
        deadline = now + (FAILOVER_WAIT_SECS if several else 0)
        follow_until = now + RETRY_AFTER_SECS
        while True:
            response = self._first_answer(method, path, kwargs, deadline, repeatable)
            if response is None:
                time.sleep(0.2)  # a takeover is under way: go round the daemons again
                continue
            wait = retry_after(response)
            if wait is None or not follow or time.monotonic() + wait > follow_until:
                break
            import random  # only here: a command that never waits does not pay for it

            time.sleep(wait * random.uniform(1.0, 1.5))  # spread the clients that come back
        if response.ok:
            return response
        text = _error_text(response)
        context = ""
        if response.status_code == 401:
            context = (
                "the scheduler rejected the key in TINYAWS_API_KEY"
                if self.key
                else "set TINYAWS_API_KEY to the scheduler's key"
            )
        elif text in _ROUTE_TEXTS and _is_text(response):
            # The server's own "no such path" (or method): the URL, not a job, is wrong. Say
            # which URL was asked, or "not found" reads as if a job were missing.
            context = (
                f"HTTP {response.status_code} from {response.url.split('?')[0]}; is"
                f" {self.base_url} the scheduler's base URL (no path after the port)?"
            )
        elif response.status_code >= 500 and _is_text(response):
            # The scheduler's 503 texts (a registry it cannot reach, a store that cannot
            # commit) say what failed but not where: name the scheduler that said it.
            context = f"HTTP {response.status_code} from the scheduler at {self.base_url}"
            if text in _REGISTRY_TEXTS:
                context += "; check the registry at its REGISTRY_URL"
        raise ApiError(response.status_code, text, context, retry_after(response))

    def _first_answer(
        self,
        method: str,
        path: str,
        kwargs: dict[str, Any],
        deadline: float,
        repeatable: bool = False,
    ) -> Response | None:
        """Ask each daemon in turn; the first real answer, or None to go round again."""
        others = [url for url in self.base_urls if url != self.base_url]
        for number, base in enumerate([self.base_url, *others]):
            last = number == len(others) and time.monotonic() >= deadline
            try:
                response = self._follow(method, base + path, kwargs)
            except NoAnswer as exc:
                if not exc.timed_out:
                    if not last:
                        self._skip(base)
                        continue
                    raise Unreachable(
                        f"cannot reach the scheduler at {base} (is it running?"
                        " is SCHEDULER_URL right?)"
                    ) from None
                if last or (exc.arrived and not repeatable):
                    read_secs = kwargs["timeout"][1]
                    raise Unreachable(
                        f"the scheduler at {base} did not answer within {read_secs:.0f}s"
                    ) from None
                self._skip(base)  # frozen or gone: the next round starts elsewhere
                continue
            if not last and response.status_code == 503 and _is_no_leader(response):
                continue
            self.base_url = base  # the one that answered: ask it first next time
            return response
        return None

    def _skip(self, base: str) -> None:
        """`base` did not answer: ask the daemon after it first from now on."""
        if base == self.base_url and len(self.base_urls) > 1:
            after = (self.base_urls.index(base) + 1) % len(self.base_urls)
            self.base_url = self.base_urls[after]

    def _follow(self, method: str, url: str, kwargs: dict[str, Any]) -> Response:
        """One request, following a standby's 307 to the leader (a few hops at most)."""
        response = self._send(method, url, kwargs)
        kwargs = {name: value for name, value in kwargs.items() if name != "params"}
        for _ in range(3):
            if response.status_code != 307 or "Location" not in response.headers:
                break
            url = urljoin(url, response.headers["Location"])  # its query is already in it
            response = self._send(method, url, kwargs)
        return response

    def _send(self, method: str, url: str, kwargs: dict[str, Any]) -> Response:
        """One request and its reply, through `plain_http` when it carries the call (a
        stream does not go through it); NoAnswer when none came."""
        if self.plain and set(kwargs) <= _PLAIN_ARGUMENTS:
            headers = dict(kwargs.get("headers") or {})
            if self.key:
                headers["Authorization"] = f"Bearer {self.key}"
            return plain_http.call(method, url, **{**kwargs, "headers": headers})
        import requests

        try:
            return self.session.request(method, url, allow_redirects=False, **kwargs)
        except requests.Timeout as exc:
            # A connect timeout is a ConnectionError too: the request never arrived.
            arrived = not isinstance(exc, requests.ConnectionError)
            raise NoAnswer(str(exc), True, arrived) from None
        except requests.RequestException as exc:
            raise NoAnswer(str(exc), False, False) from None

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise ClientError(
                f"{self.base_url}{path} answered {response.status_code} with something that is"
                " not JSON (is SCHEDULER_URL a tiny-scheduler?)"
            ) from None

    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """POST /jobs, always with an Idempotency-Key (a new one unless given): the same on
        every daemon and every retry, so a submission repeated after a deadline, on another
        daemon or after a takeover, makes one job."""
        # 128 random bits, as a uuid4's (uuid itself costs a command line's start-up more).
        headers = {"Idempotency-Key": idempotency_key or f"cli-{os.urandom(16).hex()}"}
        try:
            return self.json("POST", "/jobs", json=body, headers=headers)
        except ApiError as exc:
            # The placement text does not repeat the instance id (the others name it).
            if exc.text == _INSTANCE_NOT_FOUND and body.get("instance_id"):
                raise exc.about(f"instance {body['instance_id']} not found") from None
            raise

    def submit_batch(
        self, bodies: list[dict[str, Any]], idempotency_key: str
    ) -> list[dict[str, Any]]:
        """POST /jobs/batch: the first job of each body, all made in one transaction or none.
        The key is the batch's, as `submit`'s is the job's: a repeat makes nothing new."""
        return self.json(
            "POST", "/jobs/batch", json=bodies, headers={"Idempotency-Key": idempotency_key}
        )

    def job(self, job_id: str) -> dict[str, Any]:
        return self._job_call("GET", job_id, "")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._job_call("POST", job_id, "/cancel")

    def hold(self, job_id: str) -> dict[str, Any]:
        return self._job_call("POST", job_id, "/hold")

    def release(self, job_id: str) -> dict[str, Any]:
        return self._job_call("POST", job_id, "/release")

    def retry(self, job_id: str) -> dict[str, Any]:
        """Submit a finished job's request again as a new job; the new job."""
        return self._job_call("POST", job_id, "/retry")

    def _job_call(self, method: str, job_id: str, suffix: str) -> dict[str, Any]:
        try:
            return self.json(method, f"/jobs/{quote(job_id, safe='')}{suffix}")
        except ApiError as exc:
            # The API's 404 text does not repeat the id; someone waiting on several jobs
            # needs to know which one is meant.
            if exc.status == 404 and exc.text == JOB_NOT_FOUND:
                raise exc.about(f"job {job_id} not found") from None
            raise

    def page(
        self, limit: int, after: str | None = None, **filters: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of GET /jobs (oldest first) of at most `limit` jobs, and the `after` of the
        next page when there is one."""
        params = {name: value for name, value in filters.items() if value}
        params["limit"] = str(limit)
        if after:
            params["after"] = after
        response = self.request("GET", "/jobs", params=params)
        try:
            jobs = response.json()
        except ValueError:
            raise ClientError(
                f"{response.url} answered with something that is not JSON"
                " (is SCHEDULER_URL a tiny-scheduler?)"
            ) from None
        following = response.links.get("next", {}).get("url")
        if not following:
            return jobs, None
        return jobs, parse_qs(urlsplit(following).query).get("after", [None])[0]

    def newest(
        self, limit: int, after: str | None = None, **filters: str | None
    ) -> tuple[list[dict[str, Any]], bool]:
        """The newest `limit` jobs that match `filters` (and came after job `after`), newest
        first, and whether older ones were left out.

        The API lists oldest first and pages forward only. When everything fits in one page,
        that page is the answer. Otherwise the newest matching id is found by asking for
        one-job pages after chosen ids (galloping, then halving: O(log n) small calls), and
        the jobs below it are read back in growing windows of ids, none larger than a page.
        Ids only grow, so a window `(lower, upper]` holds at most `upper - lower` jobs.
        """
        first, following = self.page(limit, after, **filters)
        if following is None:
            return first[::-1], False
        floor = _number(after) if after else 0
        upper = self._last_number(_number(first[-1]["job_id"]), limit, filters)
        found: list[dict[str, Any]] = []  # oldest first: every match in (upper, last]
        width = limit
        while len(found) < limit and upper > floor:
            lower = max(upper - width, floor)
            page, _ = self.page(upper - lower, _job_id(lower), **filters)
            # The page may run past `upper` when the window has few matches: those jobs
            # are already in `found`.
            found = [job for job in page if _number(job["job_id"]) <= upper] + found
            upper = lower
            width = min(width * 2, MAX_PAGE)
        # The first page had a next one: more than `limit` jobs match, so some are left out.
        return found[-limit:][::-1], True

    def _last_number(self, known: int, step: int, filters: dict[str, str | None]) -> int:
        """The number of the newest matching job, given the number of one that matches."""
        low, high = known, None
        while high is None:  # gallop: double the step until nothing matches beyond
            probe = low + step
            beyond = self._first_after(probe, filters)
            if beyond is None:
                high = probe
            else:
                low, step = beyond, step * 2
        while low < high:  # `low` matches, nothing beyond `high` does
            middle = (low + high) // 2
            beyond = self._first_after(middle, filters)
            if beyond is None:
                high = middle
            else:
                low = beyond
        return low

    def _first_after(self, number: int, filters: dict[str, str | None]) -> int | None:
        page, _ = self.page(1, _job_id(number), **filters)
        return _number(page[0]["job_id"]) if page else None


def _number(job_id: str) -> int:
    return int(job_id.removeprefix(JOB_ID_PREFIX))


def _job_id(number: int) -> str | None:
    """The `after` that starts a listing past job `number`; None starts at the beginning."""
    return f"{JOB_ID_PREFIX}{number}" if number > 0 else None


_PLAIN_ARGUMENTS = {"json", "params", "headers", "timeout"}
"""The call's arguments `plain_http.call` takes: a call with any other goes by `requests`."""


def retry_after(response: Response) -> float | None:
    """The seconds a 503 asks to wait before the same call (`Retry-After`, in seconds), or
    None: the scheduler sends it only with answers that did nothing."""
    if response.status_code != 503:
        return None
    try:
        seconds = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    return seconds if 0 <= seconds <= RETRY_AFTER_SECS else None


def _is_text(response: Response) -> bool:
    return response.headers.get("Content-Type", "").startswith("text/plain")


def _error_text(response: Response) -> str:
    """The scheduler's error text as it sent it (text/plain plus a newline), or the status."""
    text = response.text.strip()
    if text and _is_text(response):
        return text
    return f"HTTP {response.status_code} from {response.url}"


# --- waiting ----------------------------------------------------------------------------------


def settled(job: dict[str, Any]) -> bool:
    """Whether waiting for a job is over: it is final, or it is a service that has started
    (a service runs until it is stopped; waiting for its end would never return)."""
    if job["status"] in FINAL_STATUSES:
        return True
    return job["job_type"] == SERVICE and job["status"] == RUNNING


def job_state(job: dict[str, Any]) -> tuple[str, str, int]:
    """What a watcher reports a change of: the status, the node, the retry count."""
    return (job["status"], job["node_id"], job["retry_count"])


def wait_for_job(
    client: Client,
    job_id: str,
    interval: float = WAIT_INTERVAL_SECS,
    progress: Callable[[str], None] | None = None,
    remind_secs: float = WAIT_REMIND_SECS,
    events: bool = True,
) -> dict[str, Any]:
    """Follow the job until it has settled (see `settled`); return it.

    With `events`, the scheduler's event stream (`job_events.JobEvents`) says when the job
    changed, and it is looked at then (and every EVENT_SAFETY_SECS regardless); without the
    stream, every `interval` seconds. `progress` gets a line, starting with the seconds since
    the wait began, whenever the job changes (status, node, retry), and again every
    `remind_secs` while it does not. A scheduler that cannot be reached is retried for
    WAIT_UNREACHABLE_SECS: a restart loses no job.
    """
    started = time.monotonic()
    last_said = started
    seen: tuple[Any, ...] = ()
    unreachable_since: float | None = None
    watch = None
    if events:
        from .job_events import JobEvents

        # A client of its own for the stream's thread.
        watch = JobEvents(Client(",".join(client.base_urls), client.key).request, job_id)

    def say(text: str) -> None:
        nonlocal last_said
        last_said = time.monotonic()
        if progress:
            progress(f"[{last_said - started:6.1f}s] {text}")

    def pause() -> None:
        if watch is not None and watch.live:
            watch.wait(min(EVENT_SAFETY_SECS, remind_secs))
        else:
            time.sleep(interval)

    try:
        while True:
            try:
                job = client.job(job_id)
                unreachable_since = None
            except Unreachable as exc:
                if not seen:
                    raise  # never reached: a wrong address, not a restart
                now = time.monotonic()
                if unreachable_since is None:
                    unreachable_since = now
                    say(f"{exc.message}; retrying")
                elif now - unreachable_since > WAIT_UNREACHABLE_SECS:
                    raise
                time.sleep(interval)
                continue
            state = job_state(job)
            if state != seen:
                seen = state
                # Attempts, counted from 1, as every command of the CLI counts them.
                again = f" (attempt {job['retry_count'] + 1})" if job["retry_count"] else ""
                say(f"{job_id} {describe(job)}{again}{waiting_text(job)}")
            elif time.monotonic() - last_said >= remind_secs:
                say(f"{job_id} still {describe(job)}{_still_until(job)}")
            if settled(job):
                return job
            pause()
    finally:
        if watch is not None:
            watch.close()


def _still_until(job: dict[str, Any]) -> str:
    """A reminder's clause: `still pending on node-1 until <time>` for a delayed job, and
    what the scheduler says it waits for otherwise."""
    what = waiting_for(job)
    if what.startswith("not before "):
        return f" until {what.removeprefix('not before ')}"
    return waiting_text(job)
