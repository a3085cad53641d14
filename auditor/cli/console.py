"""``gpu-auditor console [--db URL] [--listen HOST:PORT] [--writes]``: the web console from a store alone.

The same pages the operator serves under /console/ (docs/console.md), read from any store: the
operator's (--db, GPU_AUDITOR_DATABASE_URL or the settings file, as the other read commands find
it) or the demo's (`make demo`, then --db sqlite:///demo-out/demo.sqlite). Read-only unless
--writes: then the job page acknowledges and snoozes lineages, recorded like `gpu-auditor ack`
with the user an authenticating proxy in front names (X-Forwarded-User), else "console".
Runs until interrupted.
"""

from __future__ import annotations

import argparse
import sys
import threading

from auditor.cli.storeopts import add_store_flags
from auditor.errors import BadInput

#: where the pages are, also from ``gpu-auditor console`` (the operator's mount point)
BASE = "/console"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "console",
        help="serve the web console (cluster, teams, jobs, policy, gate, deliveries) from a store",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    add_store_flags(p)
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default="127.0.0.1:8090",
        help="address to serve on (default 127.0.0.1:8090; port 0 picks a free one)",
    )
    p.add_argument(
        "--writes",
        action="store_true",
        help="allow acknowledging and snoozing from the job page (default: read-only)",
    )
    p.set_defaults(handler=run_console)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8090`` for IPv6); BadInput naming --listen."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadInput(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8090")
    return host.strip("[]") or "127.0.0.1", int(port)


def run_console(
    args: argparse.Namespace, *, ready: threading.Event | None = None, stop: threading.Event | None = None
) -> int:
    """Serve until interrupted (or ``stop`` is set: tests); ``ready`` is set once it listens."""
    from auditor import compose
    from auditor.cli.storeopts import command_settings, open_store
    from auditor.operator_loop.health import HealthServer, OperatorMetrics

    host, port = parse_listen(args.listen)
    settings = command_settings(args)
    # read-only unless writes are on: nothing is written, so a store the user may only read can be served
    store = open_store(settings, existing=True, read_only=not args.writes)
    try:
        app = compose.console(settings, store, compose.clock().now, writes=bool(args.writes), base=BASE)
        index = (
            f'<!doctype html><meta http-equiv="refresh" content="0; url={BASE}/"><a href="{BASE}/">console</a>\n'
        ).encode()
        try:
            server = HealthServer(
                host,
                port,
                metrics=OperatorMetrics(),
                healthy=lambda: (True, ""),
                ready=lambda: (True, ""),
                routes={"/": lambda _m, _q, _b: (200, "text/html; charset=utf-8", index)},
                mounts={BASE: app.mount},
            ).start()
        except OSError as exc:  # the port is taken, the address is not this host's, a port < 1024
            raise BadInput(f"--listen {args.listen}: cannot listen there: {exc.strerror or exc}") from None
        mode = "writes enabled" if args.writes else "read-only"
        print(f"gpu-auditor: console ({mode}) on http://{host}:{server.port}{BASE}/", file=sys.stderr, flush=True)
        args.port = server.port
        if ready is not None:
            ready.set()
        try:
            (stop or threading.Event()).wait()
        finally:
            server.stop()
    finally:
        store.close()
    return 0
