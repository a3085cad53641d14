"""The store a command reads, found the way ``run`` finds it.

Every command that reads the store (``report``, ``explain``, ``policy simulate``, ``actions``)
takes its location from the same sources as the operator, highest first: ``--db``, the variable
``GPU_AUDITOR_DATABASE_URL`` (the Helm chart sets it from its Secret), the settings file
(``--config``, else ``$GPU_AUDITOR_CONFIG``, else the chart's ``/etc/gpu-auditor/settings.yaml``
when present: :func:`auditor.settings.load_cli_settings`), and only then the user's default
SQLite file. A command run inside the operator's pod thus reads the operator's store without flags.

A store without a single job is refused loudly (exit 1, naming the store): a report or a
backtest of nothing, exiting 0, is what a wrong store looks like.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from auditor.errors import PermanentError

if TYPE_CHECKING:  # imported where used: every subcommand imports this module for --help
    from auditor.settings import Settings
    from auditor.store import Store

DB_HELP = (
    "store: sqlite:///PATH or postgresql://... (default: $GPU_AUDITOR_DATABASE_URL, else the settings "
    "file's store, else the user's SQLite file)"
)
CONFIG_HELP = "settings file (default: $GPU_AUDITOR_CONFIG, else /etc/gpu-auditor/settings.yaml when it exists)"


def add_store_flags(parser: argparse.ArgumentParser) -> None:
    """``--db`` and ``--config``, with the help text that says where the store comes from."""
    parser.add_argument("--db", metavar="URL", help=DB_HELP)
    parser.add_argument("--config", metavar="FILE", help=CONFIG_HELP)


def command_settings(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> "Settings":
    """The settings of a command: the operator's sources, then ``overrides`` (its other flags as
    settings keys), ``--db`` over all of them."""
    from auditor.settings import load_cli_settings

    merged = dict(overrides or {})
    db = getattr(args, "db", None)
    if db:
        merged["store"] = {"url": db, "url_env": None}
    return load_cli_settings(getattr(args, "config", None), overrides=merged or None)


#: what to do about a store that holds nothing (the end of both "empty store" errors)
ELSEWHERE = (
    "If the operator writes elsewhere, name its store with --db URL, GPU_AUDITOR_DATABASE_URL or "
    "--config FILE (its settings file); otherwise run `gpu-auditor audit` or the operator first"
)


def open_store(settings: "Settings", *, existing: bool = False, read_only: bool = False) -> "Store":
    """Open the settings' store and say on stderr which one was read (password masked).

    ``existing`` (the commands that read what is there): a SQLite file that does not exist is
    refused instead of being created empty, so a mistyped path leaves nothing behind.
    ``read_only`` (implies ``existing``; explain, report, policy simulate, actions): nothing is
    written, so a store the user may only read can be read.
    """
    existing = existing or read_only
    from auditor import compose
    from auditor.store.urls import display_url, resolve

    url = settings.database_url()
    if existing:
        sa_url = resolve(url)
        if (
            sa_url.get_backend_name() == "sqlite"
            and sa_url.database
            and sa_url.database != ":memory:"
            and not Path(sa_url.database).exists()
        ):
            raise PermanentError(f"store {display_url(sa_url)}: no such file, so no audited jobs. {ELSEWHERE}")
    from auditor.store.database import NoSchema

    try:
        store = compose.store(settings, read_only=read_only)
    except NoSchema:  # an empty database, as a store with no job: the same message
        raise PermanentError(f"store {display_url(resolve(url))} holds no audited jobs. {ELSEWHERE}") from None
    print(f"gpu-auditor: reading store {store.display_url}", file=sys.stderr)
    return store


def require_jobs(store: "Store", cluster: str | None = None) -> None:
    """Refuse a store (or a cluster in it) that holds no job at all, naming the store."""
    if store.job_count(cluster) == 0:
        scope = f" for cluster {cluster}" if cluster else ""
        raise PermanentError(f"store {store.display_url} holds no audited jobs{scope}. {ELSEWHERE}")
