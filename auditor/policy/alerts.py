"""What a policy step says, rendered: the Slack message, the webhook payload, the job's
annotations and Event note. Pure: every user-controlled string in Slack goes through slack_escape."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from auditor.core.action_target import ActionTarget
from auditor.core.job_summary import JobSummary
from auditor.core.mfu import LINEAGE_BEST
from auditor.policy.schema import Policy
from auditor.render.slack_blocks import context, fields, header, section, slack_escape


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
    ack_url: str | None,
) -> dict:
    """The signed webhook's ``policy.violation`` payload (DESIGN's webhook contract); with a
    signed acknowledgement link, also the job's ``lineage`` and the link (``ack_url``)."""
    payload = {
        "policy": policy.name,
        "mode": policy.spec.mode.value,
        "job": target.to_ref(),
        "reason": reason,
        "advice": policy.spec.advice,
        "evidence": evidence,
        "decided_at": now.isoformat().replace("+00:00", "Z"),
        "dedup_key": key,
    }
    if ack_url:
        payload.update(lineage=lineage, ack_url=ack_url)
    return payload


def event_note(policy: Policy, reason: str) -> str:
    """The note of the Kubernetes Event an ``event`` step creates on the job."""
    return f"gpu-auditor policy {policy.name}: {reason}." + (
        f" Advice: {policy.spec.advice}" if policy.spec.advice else ""
    )


def slack_message(
    policy: Policy, summary: JobSummary, reason: str, *, ack_url: str | None = None, lineage: str | None = None
) -> tuple[str, list[dict]]:
    """The Slack alert for a violation; every user-controlled string goes through slack_escape.
    With ``ack_url`` (a signed link) it ends with a button that acknowledges the job's lineage."""

    def pct(v: float | None) -> str:
        return f"{v * 100:.0f}%" if v is not None else "n/a"

    job = f"{summary.namespace}/{summary.job}"
    text = f"gpu-auditor: {slack_escape(job)} breaks policy {slack_escape(policy.name)}"
    blocks = [
        header(f"GPU policy {policy.name}: {summary.verdict.value}"),
        section(
            f"*Job* `{slack_escape(job)}` (team {slack_escape(summary.team)}, "
            f"{slack_escape(summary.gpus)} × {slack_escape(summary.gpu_model)})\n{slack_escape(reason)}"
        ),
        fields(
            [
                ("GPU util", pct(summary.means.gpu_util)),
                ("SM active", pct(summary.means.sm_active)),
                ("Tensor active", pct(summary.means.tensor_active)),
                ("Wasted GPU-h", summary.waste_gpu_hours if summary.waste_gpu_hours is not None else "n/a"),
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
    blocks.append(
        context(
            f"Mode {policy.spec.mode.value}. Silence with the annotation `gpu-auditor.io/snooze-until: <RFC 3339 time>` on the job."
        )
    )
    if ack_url and lineage:
        blocks.append(ack_button(ack_url, lineage))
    return text, blocks


def ack_button(url: str, lineage: str) -> dict:
    """A Block Kit button opening the signed acknowledgement link (a JSON field: no mrkdwn escaping)."""
    label = f"Acknowledge {lineage}"
    return {
        "type": "actions",
        "elements": [
            {
                "type": "button",
                "text": {"type": "plain_text", "text": label[:75]},
                "url": url,
                "action_id": "gpu-auditor-ack",
            }
        ],
    }
