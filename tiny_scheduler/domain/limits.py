"""The bounds of a request that the command line shares with the API's checks.

They live apart from `validation` (which checks requests against them, with the messages that
name them) so that the command line can bound its options without importing the checks: a
`submit` in a shell loop pays for every module it imports.

Tests: `tests/test_validation.py`.
"""

from __future__ import annotations

DEFAULT_PAGE = 1000
"""Jobs a listing answers when it names no `limit`."""

MAX_PAGE = 10000
"""The most jobs one page of a listing answers."""

MIN_PRIORITY, MAX_PRIORITY = 0, 100
"""A job's `priority`, lowest and highest (higher first; 50 unless it says)."""

MAX_JOB_RETRIES_ASKED = 10
"""The most retries a job may ask for (`max_retries`)."""

MAX_ARRAY = 10_000
"""The most copies one submission may make (`array`)."""

MAX_BATCH = 10_000
"""The most jobs one batch submission (`POST /jobs/batch`) may make, its arrays' copies
counted: as many as one array."""
