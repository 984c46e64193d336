"""docs/cli.md cannot fall behind the command line (issue 36: it said it covered every command
while `queue`, `queues` and four options of `submit` were missing): its reference section is
exactly what `tiny_scheduler.cli.reference` writes from `--help` now, and its table at the top
names every command."""

from __future__ import annotations

import copy
import re

import click

from tiny_scheduler.cli import main
from tiny_scheduler.cli import reference as ref

PAGE = ref.DOC.read_text()


def test_the_reference_on_the_page_is_the_one_help_gives() -> None:
    assert ref.written(PAGE, main) == PAGE, (
        "docs/cli.md's command reference is not what --help says now: run"
        " .venv/bin/python -m tiny_scheduler.cli.reference --write"
    )


def test_every_command_and_option_is_in_the_reference() -> None:
    section = PAGE[PAGE.index(ref.BEGIN) : PAGE.index(ref.END)]
    for words, command in ref.commands(main):
        assert f"### tiny-scheduler {words}\n" in section, words
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                for name in param.opts:
                    if name != "--help":
                        assert name in section, (words, name)
    for name in ("submit", "queue set", "queues", "hold", "release", "retry"):
        assert f"### tiny-scheduler {name}\n" in section
    submit = section.split("### tiny-scheduler submit\n")[1].split("###")[0]
    for option in ("--after", "--after-any", "--priority", "--queue", "--name", "--array"):
        assert re.search(rf"[` ]{option}[ `]", submit), option


def test_the_table_names_every_command() -> None:
    table = PAGE[PAGE.index("| command | does |") : PAGE.index(ref.BEGIN)]
    first_cells = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    named = " ".join(first_cells)
    for words, command in ref.commands(main):
        if isinstance(command, click.Group) and words != "dev":
            continue  # a group of commands: its commands are named
        assert re.search(rf"`{re.escape(words)}[ `]", named), f"{words} is not in the table"


def test_a_new_option_or_command_makes_the_page_stale() -> None:
    # The check above would catch one: the reference of a changed command line differs.
    changed = copy.deepcopy(main)
    submit = changed.commands["submit"]
    submit.params.append(click.Option(["--brand-new"], help="Not documented yet."))
    assert ref.written(PAGE, changed) != PAGE
    changed.add_command(click.Command("fresh", help="Not documented yet."))
    assert "### tiny-scheduler fresh\n" in ref.reference(changed)
