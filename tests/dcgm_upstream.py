"""The DCGM and dcgm-exporter names and units as upstream's own files give them.

Reads the verbatim copies in ``tests/fixtures/dcgm/`` (each names its repository, path and
commit), so tests compare the project's name table with upstream's, not with itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "dcgm"

_ALIAS = re.compile(r'^\s*"(DCGM_FI_\w+)":\s+"(DCGM_FI_\w+)",\s+#\s*(\d+)\s*$')
_DEFINE = re.compile(r"^(DCGM_FI_\w+) = (\d+)\b")
_BASE_UNIT = re.compile(r'^\s*\{"(DCGM_FI_\w+)", \w+, (\d+), "(DCGM_FI_\w+)", (\d+)\},\s*$')
_CSV = re.compile(r"^(#\s*)?(DCGM_FI_\w+)\s*,\s*(\w+)\s*,\s*(.+)$")
_RENAME = re.compile(r"^(DCGM_FI_\w+) -> (DCGM_FI_\w+), (\S+)$")


@dataclass(frozen=True)
class Upstream:
    #: DCGM's deprecation aliases: old name → (new name, field id)
    aliases: dict[str, tuple[str, int]]
    #: field definitions of the DCGM version with the aliases: name → field id
    defined: dict[str, int]
    #: DCGM 4.7 base-unit fields (go-dcgm): new name → (new id, legacy name, legacy id)
    base_units: dict[str, tuple[int, str, int]]
    #: dcgm-exporter's shipped counters: classic name → (help text, enabled)
    counters: dict[str, tuple[str, bool]]
    #: dcgm-exporter 4.9.0's release-note sentences
    release_notes: str
    #: dcgm-exporter 4.10's renames: old name → (new name, unit); from issue 29, not yet from an
    #: upstream file (fixtures/dcgm/dcgm-exporter-4.10.0-pcie-names.txt says why)
    renames_410: dict[str, tuple[str, str]]

    def names(self, generation: str) -> set[str]:
        """The exporter names of the fields we read under ``classic``, ``dcgm-4.6``, ``exporter-4.9``
        or ``exporter-4.10``."""
        classic = set(self.counters) | set(self.aliases) | {b[1] for b in self.base_units.values()}
        renamed = {new for new, _ in self.aliases.values()}
        kept = {n for n in self.defined if n in classic}
        if generation == "classic":
            return classic
        if generation == "dcgm-4.6":
            return renamed | kept
        if generation == "exporter-4.9":  # the base-unit fields replace their legacy ones
            return renamed | (kept - {b[1] for b in self.base_units.values()}) | set(self.base_units)
        if generation == "exporter-4.10":  # 4.9's names, the PCIe rates renamed
            return (self.names("exporter-4.9") - set(self.renames_410)) | {n for n, _ in self.renames_410.values()}
        raise ValueError(generation)


def _data_lines(name: str) -> list[str]:
    return [ln for ln in (FIXTURES / name).read_text().splitlines() if not ln.startswith("# ") or _CSV.match(ln)]


def load() -> Upstream:
    aliases: dict[str, tuple[str, int]] = {}
    defined: dict[str, int] = {}
    for ln in _data_lines("dcgm_fields_aliases.txt"):
        if m := _ALIAS.match(ln):
            aliases[m[1]] = (m[2], int(m[3]))
        elif m := _DEFINE.match(ln):
            defined[m[1]] = int(m[2])
    base_units = {
        m[1]: (int(m[2]), m[3], int(m[4]))
        for ln in _data_lines("go_dcgm_base_unit_fields.txt")
        if (m := _BASE_UNIT.match(ln))
    }
    counters = {
        m[2]: (m[4].strip(), not m[1])
        for ln in (FIXTURES / "dcp-metrics-included.csv").read_text().splitlines()
        if (m := _CSV.match(ln))
    }
    notes = "\n".join(
        ln
        for ln in (FIXTURES / "dcgm-exporter-4.9.0-release-notes.txt").read_text().splitlines()
        if not ln.startswith("#")
    )
    renames_410 = {
        m[1]: (m[2], m[3]) for ln in _data_lines("dcgm-exporter-4.10.0-pcie-names.txt") if (m := _RENAME.match(ln))
    }
    if not (aliases and defined and base_units and counters and notes and renames_410):
        raise AssertionError(f"a fixture in {FIXTURES} parsed to nothing")
    return Upstream(aliases, defined, base_units, counters, notes, renames_410)


def help_unit(help_text: str) -> str:
    """The unit a dcgm-exporter help text states: ``%``, ``MHz``, ``W``, ``MiB``, ``B/s`` or ``ratio``."""
    m = re.search(r"\(in (%|MHz|W|MiB)\)", help_text)
    if m:
        return m[1]
    if re.match(r"(The )?ratio\b", help_text, re.I):
        return "ratio"
    if re.search(r"\bin bytes per second\.?$", help_text):
        return "B/s"
    raise ValueError(f"no unit in {help_text!r}")
