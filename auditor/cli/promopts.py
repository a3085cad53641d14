"""The Prometheus connection flags, shared by every command that reads Prometheus.

``audit``, ``doctor`` and ``run`` add them with :func:`add_prometheus_flags` and turn them into
settings overrides (:func:`prometheus_overrides`) and credential inputs (:func:`prometheus_auth`);
the source itself is built by the composition root (:func:`auditor.compose.prometheus_source`)
from the merged settings. So each flag means the same in every command and reaches every one
of them: the file's ``prometheus:`` section, then ``GPU_AUDITOR_*`` variables, then these flags.

Secrets are never taken as flag values (they would show in ``ps`` and shell history): a token or
password comes from a file or from ``GPU_AUDITOR_PROMETHEUS_TOKEN`` / ``GPU_AUDITOR_PROMETHEUS_PASSWORD``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from auditor.errors import BadInput

if TYPE_CHECKING:  # imported where used: every subcommand imports this module for --help
    from auditor.compose import PrometheusAuth
    from auditor.settings import Settings
    from auditor.sources.prometheus import PrometheusSource

ENV_URL = "GPU_AUDITOR_PROMETHEUS_URL"
ENV_TOKEN = "GPU_AUDITOR_PROMETHEUS_TOKEN"  # = auditor.compose.PROMETHEUS_TOKEN_ENV
ENV_PASSWORD = "GPU_AUDITOR_PROMETHEUS_PASSWORD"  # = auditor.compose.PROMETHEUS_PASSWORD_ENV
#: the flags' defaults: a flag left at its default is no override (the settings' value stays)
DEFAULT_TIMEOUT, DEFAULT_RETRIES = 60.0, 2


def add_prometheus_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that say where Prometheus is and how to talk to it (each optional: the settings
    file may say it; the composition root refuses a missing URL, naming every source of it)."""
    g = parser.add_argument_group("Prometheus")
    g.add_argument(
        "--prometheus",
        metavar="URL",
        default=os.environ.get(ENV_URL),
        help=f"Prometheus (or Thanos/Mimir/VictoriaMetrics) query URL, e.g. http://prometheus:9090 (env {ENV_URL})",
    )
    g.add_argument("--prometheus-token-file", metavar="FILE", help=f"file holding a bearer token (or env {ENV_TOKEN})")
    g.add_argument(
        "--prometheus-user",
        metavar="USER",
        help=f"basic-auth user; password from --prometheus-password-file or env {ENV_PASSWORD}",
    )
    g.add_argument("--prometheus-password-file", metavar="FILE", help="file holding the basic-auth password")
    g.add_argument("--prometheus-ca-file", metavar="FILE", help="CA bundle to verify the server's TLS certificate")
    g.add_argument("--prometheus-insecure", action="store_true", help="do not verify TLS certificates (testing only)")
    g.add_argument(
        "--prometheus-timeout",
        metavar="SECONDS",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="per-query timeout (default 60)",
    )
    g.add_argument(
        "--prometheus-retries",
        metavar="N",
        type=int,
        default=DEFAULT_RETRIES,
        help="retries on connection errors, 429 and 5xx (default 2)",
    )
    g.add_argument(
        "--prometheus-tenant",
        metavar="TENANT",
        help="tenant of a multi-tenant engine (Mimir, Cortex, Thanos Receive), sent as the X-Scope-OrgID header",
    )
    g.add_argument(
        "--match",
        metavar="LABEL=VALUE",
        action="append",
        default=[],
        help="extra label matcher on every DCGM series, e.g. cluster=prod where clusters share one Prometheus (repeatable)",
    )
    g.add_argument(
        "--pod-labels",
        choices=("auto", "pod", "exported_pod", "pod_name"),
        default="auto",
        help="which labels name the workload pod (default: detected; exported_pod when scraped with honorLabels: false)",
    )


def prometheus_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ``prometheus:`` settings the flags give (empty: none given); BadInput names the flag."""
    prom: dict[str, Any] = {}
    if args.prometheus:  # the flag, or GPU_AUDITOR_PROMETHEUS_URL (its default)
        prom["url"] = args.prometheus
    if args.prometheus_timeout != DEFAULT_TIMEOUT:
        if args.prometheus_timeout <= 0:
            raise BadInput("--prometheus-timeout must be positive")
        prom["timeout"] = args.prometheus_timeout
    if args.prometheus_retries != DEFAULT_RETRIES:
        if not 0 <= args.prometheus_retries <= 10:
            raise BadInput("--prometheus-retries must be between 0 and 10")
        prom["retries"] = args.prometheus_retries
    if args.pod_labels != "auto":
        prom["label_convention"] = args.pod_labels
    if args.prometheus_ca_file:
        if not Path(args.prometheus_ca_file).is_file():
            raise BadInput(f"--prometheus-ca-file {args.prometheus_ca_file}: no such file")
        prom["ca_file"] = args.prometheus_ca_file
    if args.prometheus_insecure:
        prom["tls_verify"] = False
    if args.prometheus_tenant is not None:
        if not args.prometheus_tenant.strip():
            raise BadInput("--prometheus-tenant: give a tenant name")
        prom["tenant"] = args.prometheus_tenant.strip()
    if args.match:
        matchers = {}
        for item in args.match:
            label, sep, value = item.partition("=")
            if not sep or not label.strip() or not label.strip().replace("_", "a").isalnum():
                raise BadInput(f"--match {item!r}: use LABEL=VALUE, e.g. cluster=prod")
            matchers[label.strip()] = value
        prom["matchers"] = matchers
    return {"prometheus": prom} if prom else {}


def prometheus_auth(args: argparse.Namespace) -> "PrometheusAuth":
    """Where the flags say the credentials are (read by the composition root, with its variables)."""
    from auditor.compose import PrometheusAuth

    return PrometheusAuth(
        token_file=args.prometheus_token_file,
        user=args.prometheus_user,
        password_file=args.prometheus_password_file,
    )


def command_source(args: argparse.Namespace, settings: "Settings") -> "PrometheusSource":
    """The Prometheus source of a command: ``settings`` (which hold the flags' overrides) and the
    flags' credentials, through the composition root."""
    from auditor import compose

    return compose.prometheus_source(settings, prometheus_auth(args))
