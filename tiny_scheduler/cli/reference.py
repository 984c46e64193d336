"""The command reference of docs/cli.md, written from the command line's own `--help`: every
command, its arguments and every option with its help text, in the order `--help` lists them.

`python -m tiny_scheduler.cli.reference --write` puts it into docs/cli.md between the two
marker lines (`BEGIN` and `END`), replacing what was there; without `--write` it prints it.
`tests/test_cli_reference.py` fails when the page's copy differs from what this writes now, so
a command or an option cannot be added without the docs saying so.

Tests: `tests/test_cli_reference.py`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click

BEGIN = "<!-- the command reference: written by python -m tiny_scheduler.cli.reference -->"
END = "<!-- end of the command reference -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
"""The page the reference is part of (in a checkout; an installed package has no docs/)."""


def commands(group: click.Group) -> Iterator[tuple[str, click.Command]]:
    """Every command under `group`, as (its words after `tiny-scheduler`, the command), in the
    order `--help` lists them; a group of commands itself too, before its own."""
    ctx = click.Context(group, info_name="tiny-scheduler")
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        yield name, command
        if isinstance(command, click.Group):
            for words, sub in commands(command):
                yield f"{name} {words}", sub


def reference(main: click.Group) -> str:
    """The reference in Markdown: the options every command takes, then one section per
    command."""
    root = click.Context(main, info_name="tiny-scheduler")
    parts = [BEGIN, "", "### tiny-scheduler", "", _paragraph(main.help or ""), ""]
    parts += _options(main, root)
    for words, command in commands(main):
        ctx = click.Context(command, info_name=f"tiny-scheduler {words}", parent=None)
        usage = " ".join(command.collect_usage_pieces(ctx))
        parts += [f"### tiny-scheduler {words}", "", f"`tiny-scheduler {words} {usage}`", ""]
        parts += [_paragraph(command.help or command.short_help or ""), ""]
        parts += _options(command, ctx)
    parts.append(END)
    return "\n".join(parts) + "\n"


def _paragraph(text: str) -> str:
    """A help text as Markdown: its paragraphs kept, each on one line (click's `\\b`
    markers, which keep a paragraph as it is written, dropped)."""
    paragraphs = [" ".join(part.split()) for part in text.split("\n\n")]
    return "\n\n".join(part for part in paragraphs if part and part != "\b")


def _options(command: click.Command, ctx: click.Context) -> list[str]:
    rows = []
    for param in command.get_params(ctx):
        if not isinstance(param, click.Option):
            continue  # arguments are in the usage line
        record = param.get_help_record(ctx)
        if record is None or "--help" in param.opts:
            continue
        names, help_text = record
        cell = " ".join(help_text.split()).replace("|", "\\|")
        rows.append(f"| `{names}` | {cell} |")
    if not rows:
        return []
    return ["| option | does |", "|---|---|", *rows, ""]


def written(page: str, main: click.Group) -> str:
    """The page with its reference replaced by the one the command line gives now."""
    start, end = page.index(BEGIN), page.index(END) + len(END) + 1
    return page[:start] + reference(main) + page[end:]


def run(argv: list[str]) -> int:
    from . import main

    if argv == ["--write"]:
        DOC.write_text(written(DOC.read_text(), main))
        print(f"wrote the command reference into {DOC}")
        return 0
    if argv:
        print("usage: python -m tiny_scheduler.cli.reference [--write]", file=sys.stderr)
        return 2
    sys.stdout.write(reference(main))
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
