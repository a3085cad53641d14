"""``gpu-auditor report``: render a week's efficiency report from the store, on demand.

``gpu-auditor report --week 2026-W48|last|this [--team T] --format html|csv|md|json --out DIR [--db URL]``
writes into DIR (several formats: ``--format html,csv``):

- html: ``report-<week>[-<team>].html`` (self-contained, charts inline)
- csv:  ``teams-<week>[-<team>].csv`` (one row per team, then the total) and
        ``jobs-<week>[-<team>].csv`` (every job active in the week, its in-week share)
- md:   ``report-<week>[-<team>].md``
- json: ``report-<week>[-<team>].json`` (the document every other format renders)

and prints the paths written. Any past week renders as long as the store still holds it.

The store and the report options (time zone, prices, currency, top N) come from the operator's
settings sources (:mod:`auditor.cli.storeopts`); flags win. Every report names the store it read
(password masked). A store without any job is an error (exit 1); a week without jobs in a
store that has some is an empty report (exit 0, with a note on stderr).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from auditor.cli.names import cluster_name
from auditor.cli.storeopts import add_store_flags
from auditor.errors import BadInput, PermanentError

FORMATS = ("html", "csv", "md", "json")


def _formats(text: str) -> list[str]:
    out = [f.strip().lower() for f in text.split(",") if f.strip()]
    bad = [f for f in out if f not in FORMATS]
    if bad or not out:
        raise BadInput(f"--format {text!r}: choose from {', '.join(FORMATS)} (comma-separated for several)")
    return list(dict.fromkeys(out))


def _prices(items: list[str]) -> tuple[dict[str, float], float]:
    per: dict[str, float] = {}
    default = 0.0
    for item in items:
        model, sep, value = item.rpartition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not sep or not model or price < 0 or price != price:
            raise BadInput(f"--price {item!r}: expected MODEL=PRICE (e.g. 'NVIDIA H200=3.5') or default=PRICE")
        if model == "default":
            default = price
        else:
            per[model] = price
    return per, default


def _slug(team: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", team).strip("_") or "team"


def _options(args: argparse.Namespace, settings: Any) -> Any:
    """The settings' ``reports`` section (what the operator's weekly reports use), flags over it."""
    from auditor.reports.aggregate import Prices
    from auditor.reports.service import options_from

    base = options_from(settings.reports)
    over: dict[str, Any] = {"cluster": args.cluster}
    if args.timezone is not None:
        over["timezone"] = args.timezone
    if args.top is not None:
        if args.top < 0:
            raise BadInput("--top must be 0 or more")
        over["top_n"] = args.top
    if args.price:
        per, default = _prices(args.price)
        over["prices"] = Prices(per, default, args.currency or base.prices.currency)
    elif args.currency is not None:
        over["prices"] = Prices(base.prices.per_model, base.prices.default, args.currency)
    return options_from(settings.reports, **over)


def parse_week(text: str, now: Any, timezone: str) -> Any:
    """``YYYY-Www``, ``last`` (the latest week that has ended, in the report's time zone: what
    the Monday report sends) or ``this`` (the week so far)."""
    from auditor.reports.weeks import IsoWeek, last_complete_week, zone

    word = text.strip().lower()
    if word == "last":
        return last_complete_week(now, zone(timezone))
    if word == "this":
        return IsoWeek.containing(now, zone(timezone))
    return IsoWeek.parse(text)


def _handle(args: argparse.Namespace) -> int:
    from auditor import compose
    from auditor.cli.storeopts import command_settings, open_store, require_jobs
    from auditor.reports.formats import teams_csv, to_json, to_markdown, write_jobs_csv
    from auditor.reports.service import generate, iter_jobs

    formats = _formats(args.format)
    settings = command_settings(args)
    opts = _options(args, settings)  # a bad --timezone, --price or --top is refused here (exit 2)
    now = compose.clock().now().replace(microsecond=0)
    week = parse_week(args.week, now, opts.timezone)
    out = writable_dir(args.out, "--out")
    suffix = f"{week}" + (f"-{_slug(args.team)}" if args.team else "")
    written: list[Path] = []
    store = open_store(settings, read_only=True)
    try:
        require_jobs(store, args.cluster)
        report = generate(store, week, now=now, options=opts, team=args.team)
        report["store"] = store.display_url
        if "json" in formats:
            p = out / f"report-{suffix}.json"
            p.write_text(to_json(report), encoding="utf-8")
            written.append(p)
        if "csv" in formats:
            p = out / f"teams-{suffix}.csv"
            p.write_text(teams_csv(report), encoding="utf-8")
            written.append(p)
            p = out / f"jobs-{suffix}.csv"
            with p.open("w", encoding="utf-8", newline="") as fh:
                write_jobs_csv(fh, str(week), iter_jobs(store, week, options=opts, team=args.team))
            written.append(p)
        if "md" in formats:
            p = out / f"report-{suffix}.md"
            p.write_text(to_markdown(report), encoding="utf-8")
            written.append(p)
        if "html" in formats:
            from auditor.reports.html import render_html

            p = out / f"report-{suffix}.html"
            p.write_text(render_html(report), encoding="utf-8")
            written.append(p)
    except OSError as exc:  # the directory was writable a moment ago: a full disk, a quota
        raise PermanentError(f"--out {out}: cannot write the report: {exc.strerror or exc}") from None
    finally:
        store.close()
    for p in written:
        print(p)
    if not report["total"]["jobs"]:
        print(f"report: {report['total']['note']} (store {report['store']})", file=sys.stderr)
    return 0


def writable_dir(text: str, flag: str) -> Path:
    """The directory ``text`` (created if missing), or :class:`BadInput` naming ``flag`` when
    it cannot be created or written, before any work is done."""
    out = Path(text)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"{flag} {text}: cannot create the directory: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise BadInput(f"{flag} {text}: the directory is not writable by this user")
    return out


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="render a week's per-team efficiency report (HTML, CSV, Markdown, JSON)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument(
        "--week",
        required=True,
        metavar="YYYY-Www",
        help="ISO week, e.g. 2026-W48; last: the latest ended week (in --timezone); this: the week so far",
    )
    p.add_argument("--team", metavar="T", help="only this team (default: every team, and the cluster total)")
    p.add_argument(
        "-o",
        "--output",
        "--format",  # the first spelling, kept as an alias (issue 30: -o everywhere)
        dest="format",
        default="html",
        metavar="FMT",
        help="the files written: html (default), csv, md, json; comma-separated for several",
    )
    p.add_argument("--out", default=".", metavar="DIR", help="output directory (default: .)")
    add_store_flags(p)
    p.add_argument(
        "--cluster", type=cluster_name, metavar="NAME", help="only this cluster, where several share one store"
    )
    p.add_argument(
        "--timezone", metavar="TZ", help="the week's time zone (IANA name; default: settings reports.timezone, UTC)"
    )
    p.add_argument(
        "--price",
        action="append",
        metavar="MODEL=PRICE",
        help="price per GPU-hour of a GPU model; default=PRICE for the rest (repeatable; default: settings reports.prices)",
    )
    p.add_argument("--currency", help="currency of the prices (default: settings reports.currency, USD)")
    p.add_argument(
        "--top", type=int, metavar="N", help="most wasteful jobs listed per team (default: settings reports.top_n, 10)"
    )
    p.set_defaults(handler=_handle)
