"""The policy runner's configuration from the settings: one builder for the operator and the CLI.

The operator (``gpu-auditor run``) passes its loaded settings (:class:`~auditor.operator_loop.policies.PolicyStage`);
``gpu-auditor audit --policies --act`` has no settings file and passes :func:`chart_notifications`,
the variable names the Helm chart sets, so both read the same names.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Mapping

from auditor.core.acklink import LinkIssuer
from auditor.errors import BadInput
from auditor.policy.runner import RequeueSettings, Route, RunnerConfig
from auditor.policy.runner_config import delivery_retry
from auditor.policy.schema import ActionKind
from auditor.settings import NotificationsSettings, Settings

log = logging.getLogger(__name__)

#: The variables the chart fills from its notification Secrets (charts/gpu-auditor/templates/_helpers.tpl,
#: configmap-settings.yaml): the contract users deploy with.
SLACK_WEBHOOK_URL_ENV = "GPU_AUDITOR_SLACK_WEBHOOK_URL"
WEBHOOK_URL_ENV = "GPU_AUDITOR_WEBHOOK_URL"
WEBHOOK_HMAC_KEY_ENV = "GPU_AUDITOR_WEBHOOK_HMAC_KEY"


def chart_notifications() -> NotificationsSettings:
    """``notifications`` as the chart renders it, without per-team routes."""
    return NotificationsSettings.model_validate(
        {
            "slack": {"webhook_url_env": SLACK_WEBHOOK_URL_ENV},
            "webhook": {"url_env": WEBHOOK_URL_ENV, "hmac_key_env": WEBHOOK_HMAC_KEY_ENV},
        }
    )


def runner_config(settings: Settings, environ: Mapping[str, str] | None = None) -> RunnerConfig:
    """Alert routes and the requeue scope from the settings; secrets from the variables they name
    (a variable that is unset or empty is no destination)."""
    env = os.environ if environ is None else environ

    def secret(name: str | None) -> str | None:
        return (env.get(name) or None) if name else None

    n = settings.notifications
    hmac_key = secret(n.webhook.hmac_key_env)
    default = Route(
        slack_url=secret(n.slack.webhook_url_env), webhook_url=secret(n.webhook.url_env), webhook_secret=hmac_key
    )
    routes = {
        team: Route(
            slack_url=secret(r.slack_webhook_url_env), webhook_url=secret(r.webhook_url_env), webhook_secret=hmac_key
        )
        for team, r in n.routes.items()
    }
    requeue = RequeueSettings(
        enabled=settings.features.requeue,
        namespaces=frozenset(settings.requeue.namespaces),
        queues=frozenset(settings.requeue.queues),
        max_per_hour=settings.requeue.max_per_hour,
    )
    disabled = {
        kind
        for kind, on in (
            (ActionKind.ANNOTATE, settings.features.annotate),
            (ActionKind.EVENT, settings.features.events),
        )
        if not on
    }
    audit_only = settings.mode == "audit"
    log.info(  # once per start: the operator builds its runner's configuration once
        "mode %s: %s",
        settings.mode,
        "policies decide and record; nothing is written to users' objects and no alert is sent (set mode: enforce to act)"
        if audit_only
        else "each policy acts in its own mode",
    )
    return RunnerConfig(
        cluster=settings.cluster,
        audit_only=audit_only,
        default_route=default,
        routes=routes,
        requeue=requeue,
        retry=delivery_retry(n.timeout, n.deadline),
        disabled_actions=frozenset(disabled),
        ack_links=link_issuer(settings),
        queue_limit=n.queue_limit,
        queue_deadline=n.queue_deadline,
    )


def link_issuer(settings: Settings) -> LinkIssuer | None:
    """The signed acknowledgement links alerts carry: with both ``gate.ack_link_key_file`` and
    ``gate.ack_link_base_url`` set, else None (also when the key file is unusable: logged, since a
    missing Secret must not stop the alerts themselves; ``doctor --config`` reports it)."""
    g = settings.gate
    if not g.ack_link_key_file or not g.ack_link_base_url:
        return None
    try:
        key = read_link_key(g.ack_link_key_file)
    except BadInput as exc:  # links are optional: alerts go out without one, and say nothing false
        log.error("alerts carry no acknowledgement link: %s", exc)
        return None
    return LinkIssuer(key, g.ack_link_base_url, g.ack_link_ttl, g.ack_link_until, g.ack_link_snooze)


def read_link_key(path: str) -> bytes:
    """The HMAC key in ``path`` (a mounted Secret's file), surrounding whitespace dropped."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise BadInput(f"gate.ack_link_key_file {path}: cannot read ({exc.strerror})") from None
    if len(key) < 16:
        raise BadInput(f"gate.ack_link_key_file {path}: the key must have at least 16 bytes")
    return key
