"""What `submit` sends, from the words of its command line, whichever parser read them: click's
(`job_commands.submit`) or the quick one of a plain `submit` (`quick.py`). One place, so the
two cannot send different jobs for the same words.

Tests: `tests/test_cli_quick.py`.
"""

from __future__ import annotations

import shlex
from typing import Any

from ..domain.states import JOB_ID_PREFIX, RUN, SERVICE


def as_job_id(text: str) -> str:
    """Accept `7` as well as `job-7`."""
    return f"{JOB_ID_PREFIX}{text}" if text.isdigit() else text


def env_pair(text: str) -> tuple[str, str] | None:
    """`K=V` as (K, V); None when it is not one (no `=`, or no name)."""
    name, sep, value = text.partition("=")
    return (name, value) if sep and name else None


def job_body(
    command: tuple[str, ...], env: dict[str, str], service: bool = False, **optional: Any
) -> dict[str, Any]:
    """The body of `POST /jobs`: one word is a shell command as it is (`submit 'echo $HOME'`),
    several are quoted and joined; the optional fields that were given (not None)."""
    body: dict[str, Any] = {
        "command": command[0] if len(command) == 1 else shlex.join(command),
        "job_type": SERVICE if service else RUN,
        "env_vars": env,
    }
    body.update({name: value for name, value in optional.items() if value is not None})
    return body
