"""Property tests: whatever labels, answer shapes and sample values one series brings, the audit
goes on, the clean jobs come out as they would without it, and a series whose name no
Kubernetes object could have is counted (issue 35, item 1).

The rules are checked against the apiserver's own (k8s.io/apimachinery
``pkg/util/validation/validation.go``: ``dns1123LabelFmt``, ``DNS1123LabelMaxLength = 63``,
``dns1123SubdomainFmt``, ``DNS1123SubdomainMaxLength = 253``; ``pkg/api/validation/generic.go``:
``ValidateNamespaceName = NameIsDNSLabel``; a pod's name is ``NameIsDNSSubdomain`` and a
container's ``IsDNS1123Label`` in k8s.io/kubernetes ``pkg/apis/core/validation``), written out
here a second time as plain regular expressions. Then arbitrary series go through the real
source (over HTTP, :class:`~tests.sources.synthetic_prometheus.SyntheticPrometheus`), both of
its read paths, and the engine.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from auditor.core.identity import InvalidIdentity, JobKey, Quarantine, check_job, check_pod, split_job
from auditor.core.model import Window
from auditor.correlate import NoKubeResolver
from auditor.engine import run_audit
from auditor.errors import AuditorError
from auditor.settings import check_cluster_name
from auditor.sources.prometheus import PrometheusSource
from tests.sources.synthetic_prometheus import Series, SyntheticPrometheus

#: the apiserver's formats (see the module's docstring), anchored
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

START = 1_767_225_600
END = START + 1800
WINDOW = Window(datetime.fromtimestamp(START, timezone.utc), datetime.fromtimestamp(END, timezone.utc))
NOW = WINDOW.end + timedelta(hours=1)
GRID = list(range(START, END, 15))
PATHS = {"aggregates": -1, "raw samples": 10**9}  # PrometheusSource(raw_read_samples=...)

#: seconds, not milliseconds (HTTP reads and audits), so slow-marked; still in `make test`
pytestmark = pytest.mark.slow
#: no example database in the work tree: each run draws afresh (a failure prints its seed)
RULES = settings(database=None)

#: anything a label value can hold (JSON strings: any code point but a lone surrogate)
any_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=300)
#: names near the rules: the alphabet of names, dots, slashes, upper case, and their edges
near_names = st.text(st.sampled_from("az09-./AZ_%\x1b \u00fc"), max_size=70) | st.sampled_from(
    ["", ".", "..", "a" * 63, "a" * 64, "a" * 253, "a" * 254, "job-1/../x", "-a", "a-", "a..b"]
)
names = any_text | near_names


def _label(value: str) -> bool:
    return len(value) <= 63 and DNS1123_LABEL.match(value) is not None and "\n" not in value


def _subdomain(value: str) -> bool:
    return len(value) <= 253 and DNS1123_SUBDOMAIN.match(value) is not None and "\n" not in value


# -- the rules ------------------------------------------------------------------------------------


@RULES
@given(names, names, names)
def test_a_pod_is_accepted_exactly_when_the_apiserver_would_accept_it(ns: str, pod: str, container: str) -> None:
    valid = _label(ns) and _subdomain(pod) and (container == "" or _label(container))
    try:
        got = check_pod(ns, pod, container)
    except InvalidIdentity as bad:
        assert not valid, f"refused a valid pod: {bad}"
        assert bad.reason in ("invalid_namespace", "invalid_pod", "invalid_container")
        return
    assert valid and got == (ns, pod, container)


@RULES
@given(names, names, names, st.text(max_size=30).filter(lambda c: check_cluster_name(c) is None))
def test_an_accepted_job_identity_survives_every_text_form(ns: str, kind: str, name: str, cluster: str) -> None:
    try:
        check_job(ns, kind, name)
    except InvalidIdentity as bad:
        assert bad.reason in ("invalid_namespace", "invalid_kind", "invalid_name")
        return
    key = JobKey(cluster, ns, kind, name)  # (a cluster is ours: the settings hold it to its rules)
    assert split_job(key.job) == (kind, name)
    assert JobKey.of(key.cluster, ns, key.job) == key
    assert JobKey.parse(str(key)) == key


labels63 = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


@RULES
@given(labels63, st.lists(labels63, min_size=1, max_size=4).map(".".join), labels63 | st.just(""))
def test_every_name_kubernetes_allows_is_accepted(ns: str, pod: str, container: str) -> None:
    assert check_pod(ns, pod, container) == (ns, pod, container)
    assert check_job(ns, "Pod", pod) == (ns, "Pod", pod)


# -- through the source and the engine ------------------------------------------------------------


def _clean() -> list[Series]:
    """Three busy pods of namespace ``clean`` (no hostile series uses that namespace)."""
    out = []
    for i, (util, sm) in enumerate([(80.0, 0.6), (30.0, 0.1), (100.0, 0.95)]):
        labels = {"UUID": f"GPU-clean-{i}", "Hostname": "node-c", "gpu": str(i), "namespace": "clean", "pod": f"p{i}"}
        out.append(Series("DCGM_FI_DEV_GPU_UTIL", labels, [(t, util) for t in GRID]))
        out.append(Series("DCGM_FI_PROF_SM_ACTIVE", labels, [(t, sm) for t in GRID]))
    return out


values = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([4294967295.0, -1.0, 0.0, -0.0, 1e308])


@st.composite
def hostile_series(draw: Any, i: int) -> Series:
    """One series of its own GPU with arbitrary pod labels and sample values on the 15 s grid."""
    ns = draw(st.sampled_from(["ml", "team-a"]) | names.filter(lambda n: n != "clean"))
    labels = {"UUID": f"GPU-hostile-{i}", "Hostname": "node-h", "gpu": str(i % 8), "namespace": ns}
    labels["pod"] = draw(names)
    if draw(st.booleans()):
        labels["container"] = draw(names)
    extra = draw(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), any_text, max_size=2))
    labels.update({k: v for k, v in extra.items() if k not in labels and k not in ("uuid", "hostname", "device")})
    name = draw(st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_FB_USED"]))
    samples = [(t, draw(values)) for t in GRID]
    return Series(name, labels, samples)


def _refused(series: list[Series]) -> int:
    """Label sets the source must refuse: a pod and a namespace given, not a Kubernetes name."""
    n = 0
    for s in series:
        ns, pod = s.labels.get("namespace", ""), s.labels.get("pod", "")
        if ns and pod:
            try:
                check_pod(ns, pod, s.labels.get("container", ""))
            except InvalidIdentity:
                n += 1
    return n


@pytest.fixture(scope="module")
def synthetic() -> Iterator[SyntheticPrometheus]:
    prom = SyntheticPrometheus()
    yield prom
    prom.close()


def _audit(prom: SyntheticPrometheus, path: str) -> tuple[dict[str, dict], Quarantine]:
    source = PrometheusSource(prom.url, raw_read_samples=PATHS[path], retries=0, timeout=10)
    try:
        result = run_audit(source, NoKubeResolver(), None, WINDOW, now=NOW)
    finally:
        source.close()
    return {s.job: s.to_json() for s in result.summaries}, result.report.rejected


@pytest.fixture(scope="module")
def baseline(synthetic: SyntheticPrometheus) -> dict[str, dict[str, dict]]:
    synthetic.series, synthetic.rewrite = _clean(), None
    return {path: _audit(synthetic, path)[0] for path in PATHS}


PROPERTY = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@PROPERTY
@given(st.data(), st.sampled_from(sorted(PATHS)))
def test_hostile_series_never_fail_the_audit_nor_change_the_clean_jobs(
    synthetic: SyntheticPrometheus, baseline: dict[str, dict[str, dict]], data: Any, path: str
) -> None:
    n = data.draw(st.integers(1, 4), label="hostile series")
    hostile = [data.draw(hostile_series(i), label=f"series {i}") for i in range(n)]
    synthetic.series, synthetic.rewrite = _clean() + hostile, None
    jobs, rejected = _audit(synthetic, path)
    clean = {job: doc for job, doc in jobs.items() if doc["namespace"] == "clean"}
    assert clean == baseline[path]
    assert rejected.total == _refused(hostile)
    assert set(rejected.counts) <= {"invalid_namespace", "invalid_pod", "invalid_container"}


@PROPERTY
@given(st.data(), st.sampled_from(sorted(PATHS)))
def test_the_clean_jobs_own_odd_values_never_fail_the_audit(
    synthetic: SyntheticPrometheus, data: Any, path: str
) -> None:
    series = _clean()
    odd = data.draw(st.lists(st.tuples(st.integers(0, len(series) - 1), st.integers(0, len(GRID) - 1), values)))
    for j, k, v in odd:
        series[j].samples[k] = (GRID[k], v)
    synthetic.series, synthetic.rewrite = series, None
    jobs, rejected = _audit(synthetic, path)
    assert set(jobs) == {"Pod/p0", "Pod/p1", "Pod/p2"} and not rejected
    for doc in jobs.values():
        assert all(
            not isinstance(v, float) or math.isfinite(v) for v in doc.values()
        )  # no NaN or infinity reaches a summary's top-level figures


def _shape(kind: str, victim: int) -> Any:
    """A rewrite of the answers that breaks one series' shape (``victim``: which series)."""

    def rewrite(path: str, doc: Any) -> Any:
        data = doc.get("data") if isinstance(doc, dict) else None
        result = data.get("result") if isinstance(data, dict) else None
        if not isinstance(result, list) or not result:
            return doc
        item = result[victim % len(result)]
        if kind == "no metric":
            item.pop("metric", None)
        elif kind == "empty values":
            item["values"] = []
        elif kind == "a point of one element":
            item["values"] = item.get("values", [])[:1] and [[item["values"][0][0]]]
        elif kind == "a timestamp as text":
            item["values"] = [[str(t), v] for t, v in item.get("values", [])]
        elif kind == "metric not an object":
            item["metric"] = ["pod", "x"]
        elif kind == "values not a list":
            item["values"] = "1,2"
        elif kind == "a label value not a string":
            item.setdefault("metric", {})[["pod", "UUID", "container", "namespace", "gpu"][victim % 5]] = 17
        elif kind == "the series twice":
            result.append(item)
        elif kind == "an extra field":
            item["histograms"] = [[0, {"count": "1"}]]
        return doc

    return rewrite


SHAPES = [
    "no metric",
    "metric not an object",
    "values not a list",
    "empty values",
    "a point of one element",
    "a timestamp as text",
    "a label value not a string",
    "the series twice",
    "an extra field",
]


@PROPERTY
@given(st.sampled_from(SHAPES), st.integers(0, 5), st.sampled_from(sorted(PATHS)))
def test_a_malformed_series_is_an_error_of_ours_or_nothing(
    synthetic: SyntheticPrometheus, kind: str, victim: int, path: str
) -> None:
    """One series of an odd shape: the audit goes on, or (the answer as a whole cannot be read)
    fails with one of our errors, never a traceback of another type."""
    synthetic.series, synthetic.rewrite = _clean(), _shape(kind, victim)
    try:
        _audit(synthetic, path)
    except AuditorError:
        pass
    finally:
        synthetic.rewrite = None
