"""``gpu-auditor version``: the version of this gpu-auditor, of Python and of the libraries whose
behaviour an admin may need to report (the Kubernetes client, SQLAlchemy, prometheus-client)."""

from __future__ import annotations

import argparse
import json
import platform
from importlib import metadata

from auditor import __version__
from auditor.cli.output import add_output_flag

#: the distributions listed besides gpu-auditor itself
LIBRARIES = ("kubernetes", "sqlalchemy", "alembic", "prometheus-client", "apscheduler")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("version", help="print the version (and, with -o json, the libraries')")
    add_output_flag(p, "the version, or with the libraries' as JSON", ("text", "json"))
    p.set_defaults(handler=run)


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"gpu-auditor": __version__, "python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def run(args: argparse.Namespace) -> int:
    v = versions()
    if args.output == "json":
        print(json.dumps(v, indent=2))
    else:
        print(f"gpu-auditor {v['gpu-auditor']}")
        print(", ".join(f"{k} {x}" for k, x in v.items() if k != "gpu-auditor" and x))
    return 0
