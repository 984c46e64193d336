"""The credential commands: `tiny-scheduler token create|list|revoke`, `whoami` and `audit`.

Clients of /tokens, /whoami and /audit: tables for people, `--json` for scripts, the
scheduler's error texts verbatim. `token create` prints the new token's secret once (the
scheduler keeps only its SHA-256); give it to its holder, who sets it as TINYAWS_API_KEY.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import click

from ..display import format_table
from .delays import parse_duration
from .history_command import moment
from .job_commands import client_from
from .output import CliError, echo_json

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")
ROLES = ("admin", "user", "viewer", "agent")


@click.group()
def token() -> None:
    """Create, list and revoke tokens (the admin's: use the shared key)."""


@token.command(name="create")
@click.option("--user", "user_name", required=True, help="The user the token is for.")
@click.option("--role", type=click.Choice(ROLES), required=True, help="What it may do.")
@click.option("--node", "node_id", help="The node an agent token is for (with --role agent).")
@click.option(
    "--expires-in",
    metavar="DURATION",
    help="It stops working after this long (90s, 30m, 12h, 7d); default: never.",
)
@_json_option
@click.pass_context
def create(
    ctx: click.Context,
    user_name: str,
    role: str,
    node_id: str | None,
    expires_in: str | None,
    as_json: bool,
) -> None:
    """Make a token and print its secret, once: it cannot be shown again."""
    body: dict[str, Any] = {"user": user_name, "role": role}
    if node_id:
        body["node_id"] = node_id
    if expires_in is not None:
        body["expires_in_secs"] = max(1, parse_duration(expires_in))
    made = client_from(ctx).json("POST", "/tokens", json=body)
    if as_json:
        echo_json(made)
        return
    click.echo(made["token"])
    what = f"{made['token_id']}: {made['user']} ({made['role']}"
    what += f" for {made['node_id']})" if made.get("node_id") else ")"
    if made.get("expires_at"):
        what += f", expires {made['expires_at']}"
    click.echo(f"{what}; the secret above is shown only now", err=True)


@token.command(name="list")
@_json_option
@click.pass_context
def list_tokens(ctx: click.Context, as_json: bool) -> None:
    """List the tokens (never their secrets)."""
    found = client_from(ctx).json("GET", "/tokens")
    if as_json:
        echo_json(found)
        return
    if not found:
        click.echo("no tokens", err=True)
        return
    rows = [
        (
            t["token_id"],
            t["user"],
            t["role"],
            t.get("node_id", "-"),
            t["created_at"],
            t.get("expires_at", "never"),
        )
        for t in found
    ]
    click.echo(format_table(("TOKEN", "USER", "ROLE", "NODE", "CREATED", "EXPIRES"), rows))


@token.command(name="revoke")
@click.argument("token_id")
@_json_option
@click.pass_context
def revoke(ctx: click.Context, token_id: str, as_json: bool) -> None:
    """Revoke token TOKEN_ID (tok-N) at once, on every daemon."""
    response = client_from(ctx).request("DELETE", f"/tokens/{quote(token_id, safe='')}")
    if response.status_code != 204:
        raise CliError(response.text.strip() or f"HTTP {response.status_code}")
    if as_json:
        echo_json({"token_id": token_id, "revoked": True})
    else:
        click.echo(f"{token_id} revoked")


def who(ctx: click.Context) -> dict[str, Any]:
    """GET /whoami: the credential in TINYAWS_API_KEY as the scheduler sees it."""
    found: dict[str, Any] = client_from(ctx).json("GET", "/whoami")
    return found


@click.command()
@_json_option
@click.pass_context
def whoami(ctx: click.Context, as_json: bool) -> None:
    """Say whom the scheduler takes TINYAWS_API_KEY for: its user, role and token."""
    found = who(ctx)
    if as_json:
        echo_json(found)
        return
    if not found.get("auth"):
        click.echo("admin (auth is off: the scheduler has no TINYAWS_API_KEY)")
        return
    if not found.get("user"):
        click.echo("admin (the shared key)")
        return
    line = f"{found['user']} ({found['role']}"
    line += f" for {found['node_id']})" if found.get("node_id") else ")"
    click.echo(f"{line}, token {found['token_id']}")


@click.command()
@click.option(
    "--since",
    metavar="DURATION|TIME",
    help="Only records this recent (90m, 1d) or from this RFC 3339 time; default: all kept.",
)
@click.option("--user", "user_name", help="Only this user's records.")
@click.option("--action", help="Only this action (submit, cancel, drain, token.revoke...).")
@click.option("--target", help="Only records about this job, node, schedule, token...")
@_json_option
@click.pass_context
def audit(
    ctx: click.Context,
    since: str | None,
    user_name: str | None,
    action: str | None,
    target: str | None,
    as_json: bool,
) -> None:
    """Show the audit trail: who changed what, when, from where, and the answer (the
    admin's). Oldest first; every page is read."""
    client = client_from(ctx)
    params: dict[str, str] = {}
    if since is not None:
        params["since"] = moment(since)
    for name, value in (("user", user_name), ("action", action), ("target", target)):
        if value:
            params[name] = value
    found: list[dict[str, Any]] = []
    while True:
        response = client.request("GET", "/audit", params=params)
        if response.status_code != 200:
            raise CliError(response.text.strip() or f"HTTP {response.status_code}")
        found.extend(response.json())
        following = response.links.get("next", {}).get("url")
        if not following:
            break
        params["after"] = following.rsplit("after=", 1)[1].split("&", 1)[0]
    if as_json:
        echo_json(found)
        return
    if not found:
        click.echo("no audit records", err=True)
        return
    rows = [
        (
            r["at"],
            r.get("user") or "(shared key)",
            r["role"],
            r["address"],
            r["action"],
            r.get("target", "-"),
            str(r["status"]),
        )
        for r in found
    ]
    click.echo(format_table(("AT", "USER", "ROLE", "ADDRESS", "ACTION", "TARGET", "STATUS"), rows))
