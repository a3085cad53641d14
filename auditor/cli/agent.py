"""``gpu-auditor agent``: the node agent (DCGM, else NVML GPM) serving dcgm-exporter-compatible metrics.

This module imports nothing beyond the standard library and :mod:`auditor.errors` at load time:
the agent's container carries only nvidia-ml-py, prometheus-client and grpcio, and
``python -m auditor.agent`` (same flags) runs it without the audit's dependencies.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from auditor.errors import BadInput

log = logging.getLogger("auditor.agent")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen", metavar="HOST:PORT", default="0.0.0.0:9400", help="where to serve /metrics (default 0.0.0.0:9400)"
    )
    p.add_argument(
        "--interval",
        metavar="DURATION",
        default="1s",
        help="sampling interval (default 1s); values served are means of these samples",
    )
    p.add_argument(
        "--pod-resources-socket",
        metavar="PATH",
        default=None,
        help=f"kubelet pod-resources socket for pod attribution (default {DEFAULT_SOCKET} when it exists; '' turns attribution off)",
    )
    p.add_argument(
        "--profiling-interval",
        metavar="DURATION",
        default="1s",
        help=(
            "NVML GPM only: how often the profiling metrics (SM, tensor, DRAM activity…) are computed, a multiple "
            "of --interval (default 1s); each is the average since the previous one"
        ),
    )
    p.add_argument(
        "--gr-engine-interval",
        metavar="DURATION",
        default="10s",
        help=(
            "NVML GPM only: how often GR_ENGINE_ACTIVE is computed (~1 ms of CPU each, the other metrics ~2 us), "
            "a multiple of --profiling-interval (default 10s); each is the average since the previous one"
        ),
    )
    p.add_argument(
        "--source",
        choices=("auto", "dcgm", "gpm", "nvml"),
        default="auto",
        help="GPU source: auto (default) = pydcgm if present, else NVML GPM (Hopper+), else NVML utilization only",
    )
    p.add_argument(
        "--node-name",
        metavar="NAME",
        default=None,
        help="value of the Hostname label (default: $NODE_NAME, else the host name)",
    )
    p.add_argument(
        "--first-window",
        metavar="DURATION",
        default="15s",
        help="what a scraper's first scrape averages over (default 15s); later scrapes average since the previous one",
    )
    p.add_argument(
        "--refresh",
        metavar="DURATION",
        default="5s",
        help="how often to ask the kubelet for pod attribution (default 5s)",
    )
    p.add_argument(
        "--resource-name",
        metavar="NAME",
        action="append",
        default=[],
        help="extra device-plugin resource to attribute (nvidia.com/gpu and nvidia.com/mig-* always are); repeatable",
    )


def ticks_per(longer: float, shorter: float, flag: str, of: str) -> int:
    """How many ``shorter`` intervals make one ``longer`` (a whole number, else a bad-input error naming ``flag``)."""
    ticks = round(longer / shorter)
    if ticks < 1 or abs(ticks * shorter - longer) > 1e-6 * max(longer, 1.0):
        raise BadInput(f"{flag} {longer:g}s: must be a whole multiple of {of} ({shorter:g}s)")
    return ticks


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "agent",
        help="node agent: per-GPU profiling metrics (DCGM, else NVML GPM) under dcgm-exporter's names",
        description=(
            "Sample every GPU of this node every second (pydcgm, else NVML GPM, else NVML utilization only) and "
            'serve /metrics with dcgm-exporter\'s names, units and labels plus source="gpu-auditor-agent"; each '
            "value is the mean of the samples since the scraper's previous scrape. GPUs are attributed to pods "
            "through the kubelet's pod-resources API. See docs/agent.md."
        ),
    )
    add_arguments(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from auditor.agent.sampler import open_sampler
    from auditor.agent.server import Agent, parse_listen, parse_seconds

    host, port = parse_listen(args.listen)
    interval = parse_seconds(args.interval, "--interval")
    first_window = parse_seconds(args.first_window, "--first-window")
    refresh = parse_seconds(args.refresh, "--refresh")
    profiling = parse_seconds(args.profiling_interval, "--profiling-interval")
    gpm_every = ticks_per(profiling, interval, "--profiling-interval", "--interval")
    slow_every = gpm_every * ticks_per(
        parse_seconds(args.gr_engine_interval, "--gr-engine-interval"),
        profiling,
        "--gr-engine-interval",
        "--profiling-interval",
    )
    socket_path = args.pod_resources_socket
    if socket_path is None:
        socket_path = DEFAULT_SOCKET if os.path.exists(DEFAULT_SOCKET) else ""
    elif socket_path and not os.path.exists(socket_path):
        log.warning(
            "pod-resources socket %s does not exist (yet); GPUs stay unattributed until it answers", socket_path
        )

    client = None
    if socket_path:
        from auditor.agent.podresources import PodResourcesClient

        client = PodResourcesClient(socket_path)
    else:
        log.info("no pod-resources socket: GPUs are served without pod labels")

    sampler = open_sampler(args.source, gpm_every=gpm_every, slow_every=slow_every)
    agent = Agent(
        sampler,
        node_name=args.node_name,
        interval=interval,
        pod_resources=client,
        refresh=refresh,
        first_window=first_window,
        extra_resources=tuple(args.resource_name),
    )
    agent.start()
    try:
        bound = agent.serve(host, port)
    except OSError as exc:
        agent.stop()
        raise BadInput(f"--listen {args.listen}: {exc.strerror or exc}") from None
    print(
        f"gpu-auditor agent: {len(agent.devices)} device(s) via {sampler.name}, serving http://{bound[0]}:{bound[1]}/metrics",
        file=sys.stderr,
        flush=True,
    )

    def _stop(signum: int, _frame: object) -> None:
        agent._stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        agent.wait()
    finally:
        agent.stop()
    return 0
