"""``gpu-auditor report``: render a week's efficiency report from the store, on demand.

``gpu-auditor report --week 2026-W48 [--team T] --format html|csv|md|json --out DIR [--db URL]``
writes into DIR (several formats: ``--format html,csv``):

- html: ``report-<week>[-<team>].html`` (self-contained, charts inline)
- csv:  ``teams-<week>[-<team>].csv`` (one row per team, then the total) and
        ``jobs-<week>[-<team>].csv`` (every job active in the week, its in-week share)
- md:   ``report-<week>[-<team>].md``
- json: ``report-<week>[-<team>].json`` (the document every other format renders)

and prints the paths written. Any past week renders as long as the store still holds it.
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

from auditor.errors import BadInput

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


def _handle(args: argparse.Namespace) -> int:
    from auditor.reports.aggregate import Prices
    from auditor.reports.formats import teams_csv, to_json, to_markdown, write_jobs_csv
    from auditor.reports.service import ReportOptions, generate, iter_jobs
    from auditor.reports.weeks import IsoWeek, zone
    from auditor.store import Store

    week = IsoWeek.parse(args.week)
    formats = _formats(args.format)
    zone(args.timezone)
    if args.top < 0:
        raise BadInput("--top must be 0 or more")
    per, default = _prices(args.price or [])
    opts = ReportOptions(
        timezone=args.timezone,
        prices=Prices(per, default, args.currency),
        top_n=args.top,
        cluster=args.cluster,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = f"{week}" + (f"-{_slug(args.team)}" if args.team else "")
    now = datetime.now(timezone.utc).replace(microsecond=0)
    written: list[Path] = []
    store = Store.open(args.db)
    try:
        report = generate(store, week, now=now, options=opts, team=args.team)
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
    finally:
        store.close()
    for p in written:
        print(p)
    if not report["total"]["jobs"]:
        print(f"report: {report['total']['note']}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="render a week's per-team efficiency report (HTML, CSV, Markdown, JSON)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--week", required=True, metavar="YYYY-Www", help="ISO week, e.g. 2026-W48")
    p.add_argument("--team", metavar="T", help="only this team (default: every team, and the cluster total)")
    p.add_argument("--format", default="html", metavar="FMT", help="html (default), csv, md, json; comma-separated for several")
    p.add_argument("--out", default=".", metavar="DIR", help="output directory (default: .)")
    p.add_argument("--db", metavar="URL", help="store: sqlite:///path or postgresql://... (default: the user's SQLite file)")
    p.add_argument("--cluster", metavar="NAME", help="only this cluster, where several share one store")
    p.add_argument("--timezone", default="UTC", metavar="TZ", help="the week's time zone (IANA name; default UTC)")
    p.add_argument("--price", action="append", metavar="MODEL=PRICE", help="price per GPU-hour of a GPU model; default=PRICE for the rest (repeatable)")
    p.add_argument("--currency", default="USD", help="currency of --price (default USD)")
    p.add_argument("--top", type=int, default=10, metavar="N", help="most wasteful jobs listed per team (default 10)")
    p.set_defaults(handler=_handle)
