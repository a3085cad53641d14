"""What a policy step says, rendered: the Slack message, the webhook payload, the job's
annotations and Event note. Pure: every user-controlled string in Slack goes through slack_escape."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from auditor.core.acklink import ACK_LABEL, hours_text, snooze_label
from auditor.core.action_target import ActionTarget
from auditor.core.figures import gpus_text
from auditor.core.job_summary import JobSummary, rfc3339
from auditor.core.mfu import LINEAGE_BEST
from auditor.policy.schema import Policy
from auditor.render.slack_blocks import context, fields, header, section, slack_escape


@dataclass(frozen=True, slots=True)
class AlertLinks:
    """The signed links one alert carries (issue 30): ``snooze_url`` pauses the running job's
    escalation for ``snooze_for``; ``ack_url`` acknowledges its ``lineage`` for the gate."""

    lineage: str
    ack_url: str
    snooze_url: str
    snooze_for: timedelta

    def buttons(self) -> list[dict[str, str]]:
        """Each link with its words and what it does: the webhook's ``buttons``, the Slack buttons."""
        return [
            {
                "action": "snooze",
                "label": snooze_label(self.snooze_for),
                "url": self.snooze_url,
                "does": f"pauses this job's escalation (no alert again, no annotation, Event or requeue) for "
                f"{hours_text(self.snooze_for)} from the click; then it goes on where it was",
            },
            {
                "action": "ack",
                "label": ACK_LABEL,
                "url": self.ack_url,
                "does": f"acknowledges lineage {self.lineage} for the efficiency gate: its next submissions are "
                "not held for these runs; the running job's escalation goes on",
            },
        ]


def mfu_text(summary: JobSummary | None) -> str:
    """The job's MFU, what it could be and what the gap costs, in one line (issue 28):
    ``MFU 15.5 % of a possible 40 % (class llm-training): 4.9 GPU-h recoverable``. Without tensor
    activity the MFU is n/a; without a reference the line says none applies (never charged)."""
    if summary is None or summary.mfu_estimate is None:
        return "MFU n/a (no tensor activity)"
    text = f"MFU {summary.mfu_estimate * 100:.1f} %"
    ref = summary.mfu_reference
    if ref is None:
        return text + " (no reference MFU applies to its workload class)"
    source = "its lineage's best run" if summary.mfu_class == LINEAGE_BEST else f"class {summary.mfu_class}"
    text += f" of a possible {ref * 100:.0f} % ({source})"
    rec = summary.recoverable_gpu_hours
    return text + (f": {rec:.2f} GPU-h recoverable" if rec is not None else "")


def job_annotations(
    policy: Policy, target: ActionTarget, summary: JobSummary | None, reason: str, now: datetime
) -> dict[str, Any]:
    """The ``gpu-auditor.io/`` annotations an ``annotate`` step writes on the job and its pods.

    ``summary`` None: a step resumed after a crash, which has only the stored ``target``; the
    figures are then unknown and written as ``n/a`` (the next violation's annotate writes them)."""

    def pct(v: float | None) -> str:
        return f"{v * 100:.1f}%" if v is not None else "n/a"

    waste = summary.waste_gpu_hours if summary is not None else None
    rec = summary.recoverable_gpu_hours if summary is not None else None
    return {
        "gpu-auditor.io/verdict": target.verdict,
        "gpu-auditor.io/policy": policy.name,
        "gpu-auditor.io/reason": reason,
        "gpu-auditor.io/gpu-util": pct(summary.means.gpu_util if summary is not None else None),
        "gpu-auditor.io/sm-active": pct(summary.means.sm_active if summary is not None else None),
        "gpu-auditor.io/waste-gpu-hours": f"{waste:.2f}" if waste is not None else "n/a",
        "gpu-auditor.io/mfu": pct(summary.mfu_estimate if summary is not None else None),
        "gpu-auditor.io/mfu-reference": pct(summary.mfu_reference if summary is not None else None),
        "gpu-auditor.io/recoverable-gpu-hours": f"{rec:.2f}" if rec is not None else "n/a",
        "gpu-auditor.io/decided-at": now.isoformat().replace("+00:00", "Z"),
    }


def webhook_payload(
    policy: Policy,
    target: ActionTarget,
    reason: str,
    evidence: dict,
    key: str,
    now: datetime,
    *,
    lineage: str,
    links: AlertLinks | None,
) -> dict:
    """The signed webhook's ``policy.violation`` payload (DESIGN's webhook contract); with
    signed links, also the job's ``lineage``, the gate's link (``ack_url``), the snooze link
    (``snooze_url``, ``snooze_for_s``) and ``buttons``: each link with its words and what it does,
    so a receiver renders the same two choices the Slack alert offers."""
    payload: dict[str, Any] = {
        "policy": policy.name,
        "mode": policy.spec.mode.value,
        "job": target.to_ref(),
        "reason": reason,
        "advice": policy.spec.advice,
        "evidence": evidence,
        "decided_at": now.isoformat().replace("+00:00", "Z"),
        "dedup_key": key,
    }
    if links is not None:
        payload.update(
            lineage=lineage,
            ack_url=links.ack_url,
            snooze_url=links.snooze_url,
            snooze_for_s=int(links.snooze_for.total_seconds()),
            buttons=links.buttons(),
        )
    return payload


def event_note(policy: Policy, reason: str) -> str:
    """The note of the Kubernetes Event an ``event`` step creates on the job."""
    return f"gpu-auditor policy {policy.name}: {reason}." + (
        f" Advice: {policy.spec.advice}" if policy.spec.advice else ""
    )


def slack_message(
    policy: Policy, summary: JobSummary, reason: str, *, links: AlertLinks | None = None
) -> tuple[str, list[dict]]:
    """The Slack alert for a violation; every user-controlled string goes through slack_escape.
    With ``links`` (signed) it ends with what each button does and the two buttons: snooze this
    job's escalation, acknowledge its lineage for the gate (issue 30: the one pauses what happens
    to the running job, the other does not)."""

    def pct(v: float | None) -> str:
        return f"{v * 100:.0f}%" if v is not None else "n/a"

    job = f"{summary.namespace}/{summary.job}"
    text = f"gpu-auditor: {slack_escape(job)} breaks policy {slack_escape(policy.name)}"
    blocks = [
        header(f"GPU policy {policy.name}: {summary.verdict.value}"),
        section(
            f"*Job* `{slack_escape(job)}` (team {slack_escape(summary.team)}, "
            f"{gpus_text(summary.gpus)} × {slack_escape(summary.gpu_model)}; "
            f"observed {rfc3339(summary.start)} → {rfc3339(summary.end)})\n{slack_escape(reason)}"
        ),
        fields(
            [
                ("GPU util", pct(summary.means.gpu_util)),
                ("SM active", pct(summary.means.sm_active)),
                ("Tensor active", pct(summary.means.tensor_active)),
                ("Wasted GPU-h", f"{summary.waste_gpu_hours:.2f}" if summary.waste_gpu_hours is not None else "n/a"),
                ("MFU", pct(summary.mfu_estimate)),
                (
                    "Recoverable GPU-h (MFU gap)",
                    f"{summary.recoverable_gpu_hours:.2f}" if summary.recoverable_gpu_hours is not None else "n/a",
                ),
            ]
        ),
        section(slack_escape(mfu_text(summary))),
    ]
    if policy.spec.advice:
        blocks.append(section(f"*Advice:* {slack_escape(policy.spec.advice)}"))
    mode = f"Mode {policy.spec.mode.value}."
    if links is None:
        blocks.append(
            context(
                f"{mode} Pause this job's escalation with the annotation "
                "`gpu-auditor.io/snooze-until: <RFC 3339 time>` on the job."
            )
        )
        return text, blocks
    said = " ".join(f"*{slack_escape(b['label'])}* {slack_escape(b['does'])}." for b in links.buttons())
    blocks.append(context(f"{mode} {said}"))
    blocks.append(alert_buttons(links))
    return text, blocks


def alert_buttons(links: AlertLinks) -> dict:
    """The Block Kit buttons opening the signed links (JSON fields: no mrkdwn escaping)."""
    return {
        "type": "actions",
        "elements": [
            {
                "type": "button",
                "text": {"type": "plain_text", "text": b["label"][:75]},
                "url": b["url"],
                "action_id": f"gpu-auditor-{b['action']}",
            }
            for b in links.buttons()
        ],
    }
