"""The health field names, ids and clock-event bits against upstream's own lines
(tests/fixtures/dcgm/dcgm_health_fields.txt: DCGM 4.6.0's dcgm_fields.h, dcgm-exporter's
default-counters.csv), so the table is checked against NVIDIA's definitions, not itself."""

from __future__ import annotations

import re
from pathlib import Path

from auditor.core.gpu_health import ClockEvent
from auditor.core.metrics import HEALTH_EXPORTED, HealthName

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm" / "dcgm_health_fields.txt"
_BIT = re.compile(r"^#define DCGM_CLOCKS_EVENT_REASON_(\w+) (0x[0-9A-F]+)LL$")
_FIELD = re.compile(r"^#define (DCGM_FI_\w+) (\d+)$")
_ALIAS = re.compile(r"^#define (DCGM_FI_\w+)\s+(DCGM_FI_\w+)(?:\s+//\s*(\d+))?$")
_CSV = re.compile(r"^(#\s*)?(DCGM_FI_\w+),\s*(\w+),\s*(.+)$")


def _upstream() -> tuple[dict[str, int], dict[str, int], dict[str, str], dict[str, bool]]:
    bits: dict[str, int] = {}
    fields: dict[str, int] = {}
    aliases: dict[str, str] = {}
    default: dict[str, bool] = {}
    for ln in FIXTURE.read_text().splitlines():
        if m := _BIT.match(ln):
            bits[m[1]] = int(m[2], 16)
        elif m := _FIELD.match(ln):
            fields[m[1]] = int(m[2])
        elif m := _ALIAS.match(ln):
            aliases[m[1]] = m[2]
        elif m := _CSV.match(ln):
            default[m[2]] = not m[1]
    return bits, fields, aliases, default


def test_clock_event_bits_are_dcgms() -> None:
    bits, _, _, _ = _upstream()
    assert len(bits) == 9
    assert {b.name: b.value for b in ClockEvent} == bits


def _upstream_id(h: HealthName, fields: dict[str, int], aliases: dict[str, str]) -> int:
    return fields[h.name] if h.current else fields[aliases[h.name]]


def test_every_health_name_has_dcgms_id_and_status() -> None:
    _, fields, aliases, default = _upstream()
    for h in HEALTH_EXPORTED:
        assert h.current == (h.name in fields), h.name
        assert h.current or h.name in aliases, h.name
        assert _upstream_id(h, fields, aliases) == h.dcgm_id, h.name
        assert h.by_default == default.get(h.name, False), h.name


def test_each_field_has_its_current_name_and_every_alias_read() -> None:
    """A Prometheus under either spelling is read: both names of each field are in the table."""
    _, fields, aliases, _ = _upstream()
    ours = {h.name for h in HEALTH_EXPORTED}
    ids = {h.dcgm_id for h in HEALTH_EXPORTED}
    for old, new in aliases.items():
        if fields[new] in ids and new != "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL":
            assert {old, new} <= ours, (old, new)


def test_the_agent_serves_health_names_the_audit_reads_at_dcgms_ids() -> None:
    from auditor.agent.fields import HEALTH

    ours = {h.name: h for h in HEALTH_EXPORTED}
    # the correctable remapped rows are served as dcgm-exporter's defaults serve them, not judged
    judged = [f for f in HEALTH if f.name != "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"]
    assert len(judged) == 6
    for f in judged:
        assert ours[f.name].dcgm_id == f.dcgm_id, f.name
        assert f.agg in ("or", "last") and not f.mig
    _, fields, aliases, default = _upstream()
    correctable = next(f for f in HEALTH if f.name == "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS")
    assert fields[aliases[correctable.name]] == correctable.dcgm_id and default[correctable.name]
