"""Log hygiene: values from outside (node ids, message ids, peers' answers, paths) are written
with their control characters escaped, so no value can forge a log line or hide in one.

`EscapeControlCharacters` is a logging filter the daemon puts on its log handlers
(`gunicorn_conf.py`), so every logged value is escaped in one place, whoever logs it.
"""

from __future__ import annotations

import logging
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(value: object) -> str:
    """`value` as text with every control character escaped (`\\n`, `\\x1b`, …)."""
    text = str(value)
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class EscapeControlCharacters(logging.Filter):
    """Escape control characters in a record's arguments (the values, not the format)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(
            isinstance(arg, str) and _CONTROL.search(arg) for arg in args
        ):
            record.args = tuple(printable(arg) if isinstance(arg, str) else arg for arg in args)
        return True
