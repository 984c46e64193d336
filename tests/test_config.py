"""Configuration: every variable parses, empty means unset, and a bad value stops start-up
with a message naming the variable (here and in the real daemon)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_scheduler.config import ConfigError, Settings
from tiny_scheduler.dev.daemon import SchedulerProcess

EVERY_VARIABLE = {
    "SCHEDULER_BIND": "127.0.0.1:9100",
    "SCHEDULER_DB": "/var/lib/ts/jobs.db",
    "REGISTRY_URL": "http://registry:9000/",
    "REGISTRY_CACHE_SECS": "0.5",
    "TINYAWS_API_KEY": "s3cret",
    "AUTH_AGENT_EXEMPT": "0",
    "MAX_JOBS_PER_NODE": "4",
    "PLACEMENT": "round-robin",
    "JOB_STEALING": "0",
    "MAX_JOB_RETRIES": "0",
    "JOB_TIMEOUT_SECS": "60",
    "TIMEOUT_SCAN_INTERVAL_SECS": "0.25",
    "NODE_LOST_SECS": "5",
    "JOB_RETENTION_SECS": "0",
    "MAX_OUTPUT_BYTES": "4096",
    "MAX_REQUEST_BYTES": "65536",
    "SQS_URL": "https://sqs:9003",
    "SQS_QUEUE": "batch",
    "SQS_POLL_INTERVAL_SECS": "1.5",
    "SNS_URL": "http://sns:9004",
    "SNS_TOPIC": "events",
}


def test_defaults_match_the_spec() -> None:
    settings = Settings.from_env({})
    assert settings == Settings()
    assert settings == Settings(
        bind="0.0.0.0:9001",
        db_path="scheduler.db",
        registry_url="http://127.0.0.1:9000",
        registry_cache_secs=2,
        api_key=None,
        auth_agent_exempt=None,
        max_jobs_per_node=1,
        placement="least-loaded",
        job_stealing=True,
        max_job_retries=1,
        job_timeout_secs=3600,
        timeout_scan_interval_secs=10,
        node_lost_secs=60,
        job_retention_secs=604800,
        max_output_bytes=1048576,
        max_request_bytes=4194304,
        sqs_url=None,
        sqs_queue="jobs",
        sqs_poll_interval_secs=5,
        sns_url=None,
        sns_topic="job-status",
    )


def test_every_variable_parses() -> None:
    assert Settings.from_env(EVERY_VARIABLE) == Settings(
        bind="127.0.0.1:9100",
        db_path="/var/lib/ts/jobs.db",
        registry_url="http://registry:9000",
        registry_cache_secs=0.5,
        api_key="s3cret",
        auth_agent_exempt=False,
        max_jobs_per_node=4,
        placement="round-robin",
        job_stealing=False,
        max_job_retries=0,
        job_timeout_secs=60,
        timeout_scan_interval_secs=0.25,
        node_lost_secs=5,
        job_retention_secs=0,
        max_output_bytes=4096,
        max_request_bytes=65536,
        sqs_url="https://sqs:9003",
        sqs_queue="batch",
        sqs_poll_interval_secs=1.5,
        sns_url="http://sns:9004",
        sns_topic="events",
    )


@pytest.mark.parametrize("text", ["auto", "AUTO", " auto "])
def test_slots_from_each_nodes_cpu_count(text: str) -> None:
    assert Settings.from_env({"MAX_JOBS_PER_NODE": text}).max_jobs_per_node == "auto"


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_variable_counts_as_unset(empty: str) -> None:
    assert Settings.from_env(dict.fromkeys(EVERY_VARIABLE, empty)) == Settings()


def test_the_connection_caps() -> None:
    settings = Settings.from_env({"MAX_CONNECTIONS": "500", "MAX_CONNECTIONS_PER_CLIENT": "50"})
    assert (settings.max_connections, settings.max_connections_per_client) == (500, 50)
    assert (Settings().max_connections, Settings().max_connections_per_client) == (10000, 2000)


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", True), ("true", True), ("YES", True), ("on", True), ("0", False), ("off", False)],
)
def test_flags(text: str, value: bool) -> None:
    assert Settings.from_env({"AUTH_AGENT_EXEMPT": text}).auth_agent_exempt is value


@pytest.mark.parametrize(
    ("env", "exempt"),
    [
        ({}, False),  # no key: nothing needs one, so nothing is exempt from it
        ({"TINYAWS_API_KEY": "k"}, True),  # auto, with a registry: the tiny-aws agent sends none
        ({"TINYAWS_API_KEY": "k", "AUTH_AGENT_EXEMPT": "auto"}, True),
        ({"TINYAWS_API_KEY": "k", "REGISTRY_URL": "builtin"}, False),  # auto: our agents send it
        ({"TINYAWS_API_KEY": "k", "REGISTRY_URL": "builtin", "AUTH_AGENT_EXEMPT": "1"}, True),
        ({"TINYAWS_API_KEY": "k", "AUTH_AGENT_EXEMPT": "0"}, False),
    ],
)
def test_the_agent_exemption_is_on_only_where_it_is_needed(
    env: dict[str, str], exempt: bool
) -> None:
    assert Settings.from_env(env).agent_exempt is exempt


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAX_JOBS_PER_NODE", "abc"),
        ("MAX_JOBS_PER_NODE", "0"),
        ("MAX_JOBS_PER_NODE", "1.5"),
        ("MAX_JOBS_PER_NODE", "automatic"),
        ("PLACEMENT", "random"),
        ("PLACEMENT", "least_loaded"),
        ("JOB_STEALING", "sometimes"),
        ("MAX_JOB_RETRIES", "-1"),
        ("JOB_TIMEOUT_SECS", "1h"),
        ("JOB_RETENTION_SECS", "-1"),
        ("MAX_OUTPUT_BYTES", "10"),
        ("MAX_REQUEST_BYTES", "lots"),
        ("REGISTRY_CACHE_SECS", "-1"),
        ("REGISTRY_CACHE_SECS", "two"),
        ("REGISTRY_CACHE_SECS", "nan"),
        ("TIMEOUT_SCAN_INTERVAL_SECS", "0"),
        ("TIMEOUT_SCAN_INTERVAL_SECS", "inf"),
        ("NODE_LOST_SECS", "-5"),
        ("SQS_POLL_INTERVAL_SECS", "0"),
        ("AUTH_AGENT_EXEMPT", "maybe"),
        ("MAX_CONNECTIONS", "10"),
        ("MAX_CONNECTIONS", "many"),
        ("MAX_CONNECTIONS_PER_CLIENT", "0"),
        ("REGISTRY_URL", "registry:9000"),
        ("SQS_URL", "ftp://sqs"),
        ("SNS_URL", "sns"),
    ],
)
def test_a_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({name: value})
    assert name in str(caught.value)
    assert repr(value) in str(caught.value)


def test_a_bad_variable_stops_the_daemon_with_a_message_naming_it(tmp_path: Path) -> None:
    log = tmp_path / "scheduler.log"
    proc = SchedulerProcess(
        str(tmp_path / "jobs.db"), env={"MAX_JOBS_PER_NODE": "abc"}, log_path=str(log)
    )
    proc.start(wait=False)
    assert proc.proc is not None
    code = proc.proc.wait(timeout=30)
    proc.stop()  # closes the log file
    assert code != 0
    assert "MAX_JOBS_PER_NODE" in log.read_text()
    assert not (tmp_path / "jobs.db").exists()
