"""The exporter-name table (auditor.core.metrics) against upstream's own files.

The fixture in tests/fixtures/dcgm/ is copied from NVIDIA/DCGM, NVIDIA/go-dcgm and
NVIDIA/dcgm-exporter (each file names its origin). A name or unit the project invents, or one
upstream renamed that the project misses, fails here: the table is not checked against itself.
"""

from __future__ import annotations

import pytest
from dcgm_upstream import help_unit, load

from auditor.agent.fields import BY_NAME as AGENT_FIELDS
from auditor.core.metrics import (
    BY_NAME,
    EXPORTED,
    SPECS,
    UTIL_RATIO,
    Metric,
    Naming,
    detect_naming,
    name_for,
    normalize,
    scale_of,
)

UP = load()
#: a dcgm-exporter unit (as its help text says it) → the factor into the project's unit
TO_PROJECT = {"%": 0.01, "ratio": 1.0, "MHz": 1.0, "W": 1.0, "MiB": 1.0, "B/s": 1.0}


def test_every_name_the_project_reads_is_one_upstream_defines():
    upstream = UP.names("classic") | UP.names("dcgm-4.6") | UP.names("exporter-4.9") | UP.names("exporter-4.10")
    invented = sorted({e.name for e in EXPORTED} - upstream)
    assert invented == []  # was: DCGM_FI_PROF_PIPE_{TENSOR,FP32,FP16}_UTIL_RATIO


@pytest.mark.parametrize("old", sorted(UP.aliases))
def test_dcgm_4_6_renames_map_to_the_same_metric(old):
    new, _ = UP.aliases[old]
    if old not in BY_NAME:  # a field the audit does not read (FP64)
        assert new not in BY_NAME
        return
    assert BY_NAME[new] is BY_NAME[old]
    assert name_for(BY_NAME[old], Naming.DCGM46) == new


def test_fields_whose_names_dcgm_4_6_kept_are_read_under_those_names():
    for name in ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MAX_SM_CLOCK", "DCGM_FI_DEV_FB_USED"):
        assert name in UP.defined
        assert name_for(BY_NAME[name], Naming.DCGM46) == name
    # the power field's new name is what the 4.6 file defines at the old id
    assert UP.defined["DCGM_FI_DEV_BOARD_POWER_WATTS"] == UP.aliases["DCGM_FI_DEV_POWER_USAGE"][1]


@pytest.mark.parametrize("name", sorted(UP.counters))
def test_classic_units_are_the_ones_dcgm_exporter_states(name):
    help_text, _ = UP.counters[name]
    assert scale_of(name, Naming.CLASSIC) == TO_PROJECT[help_unit(help_text)]


def test_dcgm_4_6_names_keep_the_field_ids_so_the_units():
    # an alias is the same field id: the same values, so the same scale as the classic name
    for old, (new, _) in UP.aliases.items():
        if old in BY_NAME:
            assert scale_of(new, Naming.DCGM46) == scale_of(old, Naming.CLASSIC), new
    assert scale_of(UTIL_RATIO, Naming.DCGM46) == 0.01  # field 203, an integer percent


def test_dcgm_4_7_base_unit_clocks_are_hertz():
    assert "clocks from MHz to hertz" in UP.release_notes
    for new, (new_id, legacy, legacy_id) in UP.base_units.items():
        assert new_id != legacy_id  # a new field, not an alias: the legacy name stays in MHz
        assert BY_NAME[new] is BY_NAME[legacy]
        assert scale_of(new, Naming.EXPORTER49) == pytest.approx(1e-6)
        assert scale_of(legacy, Naming.EXPORTER49) == 1.0
        assert name_for(BY_NAME[legacy], Naming.EXPORTER49) == new


def test_exporter_4_9_utilization_is_a_ratio():
    assert "utilization from a percentage to a 0 to 1 ratio" in UP.release_notes
    assert UP.aliases["DCGM_FI_DEV_GPU_UTIL"][0] == UTIL_RATIO  # DCGM's current name for field 203
    assert scale_of(UTIL_RATIO, Naming.EXPORTER49) == 1.0


def test_exporter_4_9_memory_in_bytes_is_not_read_under_a_guessed_name():
    # 4.9 exports GPU memory in bytes, but no copied upstream file spells the used-memory name:
    # framebuffer use is read only under the name the fixture defines (field 252, MiB)
    assert "GPU memory from MiB to bytes" in UP.release_notes
    assert SPECS[Metric.FB_USED].names == ("DCGM_FI_DEV_FB_USED",)
    assert UP.counters["DCGM_FI_DEV_FB_USED"][0].endswith("(in MiB).")


@pytest.mark.parametrize(
    ("generation", "util", "expected"),
    [
        ("classic", [80.0], Naming.CLASSIC),
        ("dcgm-4.6", [80.0, 3.0], Naming.DCGM46),
        ("dcgm-4.6", [0.8, 0.35], Naming.EXPORTER49),  # 4.9 without its clock fields: told by the values
        ("exporter-4.9", [80.0], Naming.EXPORTER49),  # a *_HERTZ name settles it whatever the values
        ("exporter-4.9", [], Naming.EXPORTER49),
    ],
)
def test_naming_detected_from_upstream_name_sets(generation, util, expected):
    names = UP.names(generation) & set(BY_NAME)  # FP64 is not read
    assert detect_naming(names, util)[0] is expected
    if generation != "dcgm-4.6":  # without values too
        naming, why, unknown = detect_naming(names)
        assert naming is expected and why and not unknown


def test_util_ratio_of_only_zeros_and_ones_is_not_given_a_unit():
    # a GPU at 0–1 % (4.6) and one at 0 or 100 % (4.9) export the same numbers: no guess
    guess = detect_naming(UP.names("dcgm-4.6") & set(BY_NAME), [0.0, 1.0, 1.0])
    assert guess.util_unknown and "cannot tell" in guess.why
    assert not detect_naming(UP.names("dcgm-4.6") & set(BY_NAME), [0.0, 1.0, 37.0]).util_unknown
    assert not detect_naming(UP.names("exporter-4.9") & set(BY_NAME), [0.0, 1.0]).util_unknown
    assert not detect_naming(UP.names("classic"), [0.0, 1.0]).util_unknown


# one physical state (a GPU at 80 % utilization, 1980 MHz, 350.5 W, 40 GiB used, SM activity 0.4)
# in each generation's exporter units
STATE = {
    Metric.GPU_UTIL: {"classic": 80.0, "dcgm-4.6": 80.0, "exporter-4.9": 0.8, "project": 0.8},
    Metric.SM_CLOCK: {"classic": 1980.0, "dcgm-4.6": 1980.0, "exporter-4.9": 1.98e9, "project": 1980.0},
    Metric.MAX_SM_CLOCK: {"classic": 1980.0, "dcgm-4.6": 1980.0, "exporter-4.9": 1.98e9, "project": 1980.0},
    Metric.POWER: {"classic": 350.5, "dcgm-4.6": 350.5, "exporter-4.9": 350.5, "project": 350.5},
    Metric.FB_USED: {"classic": 40960.0, "dcgm-4.6": 40960.0, "exporter-4.9": 40960.0, "project": 40960.0},
    Metric.SM_ACTIVE: {"classic": 0.4, "dcgm-4.6": 0.4, "exporter-4.9": 0.4, "project": 0.4},
}


@pytest.mark.parametrize("generation", ["classic", "dcgm-4.6", "exporter-4.9"])
def test_every_generation_normalizes_to_one_unit(generation):
    naming = Naming(generation)
    names = UP.names(generation)
    for metric, values in STATE.items():
        (name,) = [n for n in names if BY_NAME.get(n) is metric]
        got = normalize(metric, values[generation], scale_of(name, naming))
        assert got == pytest.approx(values["project"]), (generation, name)


def test_agent_serves_classic_names_at_dcgms_field_ids():
    # the node agent reads DCGM by numeric id and serves the classic names: both must be DCGM's
    ids = {old: fid for old, (_, fid) in UP.aliases.items()} | {
        n: i for n, i in UP.defined.items() if n in UP.names("classic")
    }
    checked = [n for n in ids if n in AGENT_FIELDS]
    assert len(checked) >= 10
    for name in checked:
        assert AGENT_FIELDS[name].dcgm_id == ids[name], name
