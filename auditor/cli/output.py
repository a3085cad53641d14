"""``-o/--output table|wide|json|yaml`` for the commands that print jobs, as kubectl has it.

``table`` (default) fits 120 columns; ``wide`` has every column; ``json`` is the audit JSON (the
contract: DESIGN.md, docs/verdicts.md), unchanged; ``yaml`` is the same documents as YAML, for
a reader who prefers it. Shared by ``audit`` and ``run --once`` so the two print alike, and the
flag itself by every command with output formats (``text|json`` for the ones that print prose).
"""

from __future__ import annotations

import argparse
import json
from typing import IO, Any, Sequence

#: the formats, in the order ``--help`` lists them
JOB_FORMATS = ("table", "wide", "json", "yaml")


def add_output_flag(
    p: argparse.ArgumentParser,
    what: str,
    formats: Sequence[str] = JOB_FORMATS,
    *,
    aliases: Sequence[str] = (),
    dest: str = "output",
) -> None:
    """``-o/--output FORMAT`` for every command that prints in more than one format, so one
    spelling works everywhere (issue 30); ``aliases`` keeps a command's older spelling
    (``report --format``) working. The default is the first format; ``what`` says what is
    printed, and the help names only the formats this command has."""
    notes = []
    if "table" in formats:
        notes.append("table fits 120 columns")
    if "wide" in formats:
        notes.append("wide has every column")
    p.add_argument(
        "-o",
        "--output",
        *aliases,
        dest=dest,
        choices=tuple(formats),
        default=formats[0],
        help=f"{what}: {', '.join(formats)} (default {formats[0]}{''.join('; ' + n for n in notes)})",
    )


def dump_yaml(docs: Any) -> str:
    """``docs`` as YAML: the JSON documents (times already strings), keys in their JSON order."""
    import yaml

    return yaml.safe_dump(json.loads(json.dumps(docs, default=str)), sort_keys=False, allow_unicode=True)


def print_jobs(summaries: Sequence[Any], docs: list[dict], fmt: str, file: IO[str]) -> None:
    """The jobs in ``fmt``: the verdict table (``table``/``wide``) from ``summaries``, or the
    audit-JSON ``docs`` as JSON or YAML."""
    if fmt == "json":
        print(json.dumps(docs, indent=2, default=str), file=file)
    elif fmt == "yaml":
        file.write(dump_yaml(docs))
    else:
        from auditor.render.table import format_table

        print(format_table(summaries, wide=fmt == "wide"), file=file)
