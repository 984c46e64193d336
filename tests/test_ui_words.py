"""The dashboard says what the command line says: one word, "attempts", counted from 1 (the
CLI's ATTEMPTS column and `status`), on the job list and the job page."""

from __future__ import annotations

from harness import Harness


def test_the_dashboard_counts_attempts_as_the_cli_does() -> None:
    h = Harness(max_job_retries=2)
    job = h.submit("flaky")
    h.claim(job.job_id)
    h.report(job.job_id, exit_code=1)  # the first attempt failed: the second waits
    client = h.app().test_client()
    page = client.get(f"/ui/jobs/{job.job_id}").get_data(as_text=True)
    assert "<dt>Attempts</dt><dd>2</dd>" in page
    listing = client.get("/ui/jobs").get_data(as_text=True)
    assert "<th>Attempts</th>" in listing and '<td data-label="Attempts">2</td>' in listing
    assert "Tries" not in page + listing
