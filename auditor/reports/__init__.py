"""Weekly per-team efficiency reports (docs/reports.md).

``service.generate`` reads a week from the store into the report document (``aggregate``);
``html``, ``formats`` and ``slack`` render it; ``delivery`` decides when a week is due and
sends each team's report exactly once (the ledger lives in ``auditor.store.reports``).
"""

from auditor.reports.aggregate import ALL_TEAMS, Prices, build_report, team_view
from auditor.reports.delivery import (
    Destinations,
    SendResult,
    add_report_job,
    build_trigger,
    due_week,
    latest_fire,
    send_due_reports,
)
from auditor.reports.service import ReportOptions, generate, iter_jobs, options_from
from auditor.reports.weeks import IsoWeek

__all__ = [
    "ALL_TEAMS",
    "Destinations",
    "IsoWeek",
    "Prices",
    "ReportOptions",
    "SendResult",
    "add_report_job",
    "build_report",
    "build_trigger",
    "due_week",
    "generate",
    "iter_jobs",
    "latest_fire",
    "options_from",
    "send_due_reports",
    "team_view",
]
