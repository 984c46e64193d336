"""URLs as the daemon shows them: in its banner, its log and its error messages.

An operator may put credentials in REGISTRY_URL, SQS_URL, SNS_URL or SCHEDULER_DB
(`http://user:secret@host`, `postgresql://sched:pw@db/jobs?sslpassword=…`). A log is read,
shipped and kept by more people and systems than the configuration is, so every place that
shows such a URL shows `redacted(url)`, never the URL itself. Pure string work: nothing here
connects, logs or reads the environment.
"""

from __future__ import annotations

import re

HIDDEN = "***"
"""What stands in a shown URL for a secret."""

# Query parameters whose values are secrets by their name: libpq's password and sslpassword,
# and the tokens, keys and signatures that HTTP services take in a query.
_SECRET_PARAMETER = re.compile(
    r"(?P<name>(?:^|[?&;])[^=&;#]*(?:pass|secret|token|key|sig|auth|credential)[^=&;#]*=)"
    r"[^&;#]*",
    re.IGNORECASE,
)


def redacted(url: str) -> str:
    """`url` without its secrets: the password of its user info (`user:***@host`), a user
    info that has no password (`***@host`: a lone name is usually a token), and the values
    of query parameters named like secrets. A text without `://` is read as what follows
    it (`user:pw@host:9000`, a URL someone forgot the scheme of).

    The parts are found by hand rather than with urllib, which refuses some malformed URLs
    (a bad port, an unclosed `[`); those must be shown without their secrets all the same,
    as in the error message that says they are malformed.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    user_info, at, host = authority.rpartition("@")
    if at:
        user, colon, _ = user_info.partition(":")
        authority = f"{user}:{HIDDEN}@{host}" if colon else f"{HIDDEN}@{host}"
    path, hash_sign, fragment = tail.partition("#")
    before, question, query = path.partition("?")
    if question:
        query = _SECRET_PARAMETER.sub(rf"\g<name>{HIDDEN}", query)
    return f"{scheme}{separator}{authority}{before}{question}{query}{hash_sign}{fragment}"
