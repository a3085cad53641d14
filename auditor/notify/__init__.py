"""Notifiers: Slack incoming webhooks (Block Kit) and a generic signed JSON webhook.

Both are plain adapters with one ``send`` method returning a :class:`Delivery`; policies and the
weekly reports use them alike. Neither raises on a failed delivery: the caller records the result.
"""

from auditor.notify.http import Delivery, RetryPolicy
from auditor.notify.slack import SlackNotifier
from auditor.notify.webhook import WEBHOOK_BODY_VERSION, WebhookNotifier, sign, verify_signature
from auditor.render.slack_blocks import slack_escape

__all__ = [
    "Delivery",
    "RetryPolicy",
    "SlackNotifier",
    "WebhookNotifier",
    "WEBHOOK_BODY_VERSION",
    "sign",
    "slack_escape",
    "verify_signature",
]
