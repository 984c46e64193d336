"""Log hygiene: values from outside (node ids, message ids, peers' answers) are written with
their control characters escaped, so no value can forge a log line or hide in one."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(value: object) -> str:
    """`value` as text with every control character escaped (`\\n`, `\\x1b`, …)."""
    text = str(value)
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
