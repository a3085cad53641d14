"""The Prometheus source against a real Prometheus (backfilled through promtool).

Each test labels its series with a unique ``case`` label and reads through
``matchers={"case": ...}``, so tests sharing one server never see each other's data.
"""

from __future__ import annotations

import math
import re
import time
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from dcgm_upstream import load

from auditor.core.metrics import BY_NAME, Metric
from auditor.core.model import PodRef, Window
from auditor.errors import BadInput, QueryRefused, SourceUnavailable
from auditor.sources import promql
from auditor.sources.prometheus import PrometheusClient, PrometheusSource

pytestmark = pytest.mark.testbed

WIDTH = timedelta(minutes=5)
STEP = 15  # seconds between samples


def _window() -> tuple[int, int]:
    """A 30-minute, 5-minute-aligned window ending about an hour ago (unix seconds)."""
    end = int(time.time()) // 300 * 300 - 3600
    return end - 1800, end


def _om(series: list[tuple[str, dict[str, str], list[tuple[float, float]]]]) -> str:
    """OpenMetrics text for promtool backfill, one family per metric name."""
    families: dict[str, list[str]] = {}
    for name, labels, samples in series:
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        lines = families.setdefault(name, [])
        for ts, value in samples:
            text = "NaN" if isinstance(value, float) and math.isnan(value) else repr(value)
            lines.append(f"{name}{{{lab}}} {text} {ts}")
    out: list[str] = []
    for name, lines in families.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(lines)
    out.append("# EOF")
    return "\n".join(out) + "\n"


def _const(start: int, end: int, value: float, step: int = STEP) -> list[tuple[float, float]]:
    return [(t, value) for t in range(start, end, step)]


def _gpu(case: str, n: int, **extra: str) -> dict[str, str]:
    labels = {
        "case": case,
        "gpu": str(n % 8),
        "UUID": f"GPU-{case}-{n}",
        "Hostname": f"node-{n // 8}",
        "modelName": "NVIDIA H200",
        "device": f"nvidia{n % 8}",
    }
    labels.update(extra)
    return labels


def _requests_total(url: str) -> float:
    """Prometheus's own count of API calls, from its /metrics endpoint (not a query itself)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and "/api/v1/" in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _by(buckets, metric):
    return [b for b in buckets if b.metric is metric]


def test_pod_convention_half_open_buckets(prometheus):
    case = f"c{uuid.uuid4().hex[:8]}"
    s, e = _window()
    series = []
    for i in range(2):
        labels = _gpu(case, i, pod=f"train-{i}", namespace="ml", container="main")
        series.append(("DCGM_FI_DEV_GPU_UTIL", labels, _const(s, e, 100)))
        series.append(("DCGM_FI_PROF_SM_ACTIVE", labels, _const(s, e, 0.25 * (i + 1))))
    prometheus.backfill(_om(series))

    src = PrometheusSource(prometheus.url, matchers={"case": case})
    res = src.read(Window(_utc(s), _utc(e)), WIDTH)
    util = _by(res.buckets, Metric.GPU_UTIL)
    assert len(util) == 2 * 6
    # 15 s samples starting on a boundary: exactly 20 per [start, end) bucket, never 21
    assert {b.count for b in res.buckets} == {20}
    assert all(b.mean == pytest.approx(1.0) for b in util)
    sm = {b.pod.pod: b.mean for b in _by(res.buckets, Metric.SM_ACTIVE)}
    assert sm == {"train-0": pytest.approx(0.25), "train-1": pytest.approx(0.5)}
    b = util[0]
    assert b.pod == PodRef("ml", "train-0", "main")
    assert b.gpu.uuid == f"GPU-{case}-0" and b.gpu.hostname == "node-0" and b.gpu.model == "NVIDIA H200"
    assert (b.end - b.start) == WIDTH and b.start.timestamp() % 300 == 0
    assert res.report.present == {Metric.GPU_UTIL, Metric.SM_ACTIVE}
    assert res.report.labels["pod"] == "pod" and res.report.labels["hostname"] == "Hostname"
    assert res.report.scrape_interval == pytest.approx(15.0)
    assert res.report.dropped == {}


def test_exported_pod_convention_and_unattributed_gpus(prometheus):
    """honorLabels false: ``pod`` names the exporter; workloads are in ``exported_pod``."""
    case = f"c{uuid.uuid4().hex[:8]}"
    s, e = _window()
    exporter = {"pod": "nvidia-dcgm-exporter-x7k2p", "namespace": "gpu-operator", "container": "nvidia-dcgm-exporter"}
    busy = _gpu(case, 0, exported_pod="llm-0", exported_namespace="team-a", exported_container="worker", **exporter)
    busy["hostname"] = busy.pop("Hostname")  # dcgm-exporter after 4.8.2
    idle = _gpu(case, 1, **exporter)  # no workload on this GPU
    idle["hostname"] = idle.pop("Hostname")
    series = [
        ("DCGM_FI_DEV_GPU_UTIL", busy, _const(s, e, 100)),
        ("DCGM_FI_DEV_GPU_UTIL", idle, _const(s, e, 0)),
        ("DCGM_FI_PROF_SM_ACTIVE", busy, _const(s, e, 0.0076)),
        ("DCGM_FI_PROF_SM_ACTIVE", idle, _const(s, e, 0.0)),
    ]
    prometheus.backfill(_om(series))

    res = PrometheusSource(prometheus.url, matchers={"case": case}).read(Window(_utc(s), _utc(e)), WIDTH)
    pods = {b.pod for b in res.buckets}
    assert pods == {PodRef("team-a", "llm-0", "worker")}
    assert res.report.labels["pod"] == "exported_pod"
    assert res.report.labels["hostname"] == "hostname"
    assert any("1 of 2 GPUs had no workload pod" in w for w in res.report.warnings)
    assert any("honorLabels" in w for w in res.report.warnings)
    assert {b.gpu.hostname for b in res.buckets} == {"node-0"}


def test_exporter_pod_without_any_workload_is_not_a_job(prometheus):
    case = f"c{uuid.uuid4().hex[:8]}"
    s, e = _window()
    labels = _gpu(case, 0, pod="nvidia-dcgm-exporter-abcde", namespace="gpu-operator", container="nvidia-dcgm-exporter")
    prometheus.backfill(_om([("DCGM_FI_DEV_GPU_UTIL", labels, _const(s, e, 0))]))
    res = PrometheusSource(prometheus.url, matchers={"case": case}).read(Window(_utc(s), _utc(e)), WIDTH)
    assert res.buckets == []
    assert any("honorLabels: true" in w for w in res.report.warnings)


#: one GPU state in each naming's exporter units: 80 % utilization, SM clock 1980 MHz, 350.5 W
_STATE = {
    "classic": {Metric.GPU_UTIL: 80, Metric.SM_CLOCK: 1980, Metric.POWER: 350.5},
    "dcgm-4.6": {Metric.GPU_UTIL: 80, Metric.SM_CLOCK: 1980, Metric.POWER: 350.5},  # same field ids, same values
    "exporter-4.9": {Metric.GPU_UTIL: 0.8, Metric.SM_CLOCK: 1.98e9, Metric.POWER: 350.5},  # ratio, hertz
}
_RATIOS = {
    Metric.SM_ACTIVE: 0.4,
    Metric.TENSOR_ACTIVE: 0.2,
    Metric.FP32_ACTIVE: 0.15,
    Metric.FP16_ACTIVE: 0.05,
    Metric.DRAM_ACTIVE: 0.1,
}


@pytest.mark.parametrize("generation", ["classic", "dcgm-4.6", "exporter-4.9"])
def test_each_naming_is_detected_and_read_in_one_unit(prometheus, generation):
    """Series named as upstream names them (tests/fixtures/dcgm/) read to the same buckets."""
    names = load().names(generation)
    case = f"c{uuid.uuid4().hex[:8]}"
    s, e = _window()
    labels = _gpu(case, 0, pod="p", namespace="ns")
    values = _STATE[generation] | _RATIOS
    series = [(n, labels, _const(s, e, values[BY_NAME[n]])) for n in sorted(names) if BY_NAME.get(n) in values]
    assert {BY_NAME[n] for n, _, _ in series} == set(values)  # every metric under this naming's name
    prometheus.backfill(_om(series))
    src = PrometheusSource(prometheus.url, matchers={"case": case})
    res = src.read(Window(_utc(s), _utc(e)), WIDTH)
    means = {b.metric: b.mean for b in res.buckets}
    assert means == {
        Metric.GPU_UTIL: pytest.approx(0.8),
        Metric.SM_CLOCK: pytest.approx(1980),
        Metric.POWER: pytest.approx(350.5),
        **{m: pytest.approx(v) for m, v in _RATIOS.items()},
    }
    assert res.report.labels["naming"] == generation
    assert src.stats.naming.value == generation
    assert not any("cannot tell" in w for w in res.report.warnings)


def test_util_ratio_without_4_9_names_is_told_by_its_values(prometheus):
    """DCGM_FI_DEV_GPU_UTIL_RATIO alone: whole numbers above 1 are DCGM 4.6's percent, fractions
    are dcgm-exporter 4.9's ratio; only 0s and 1s cannot tell: then GPU utilization is not read
    (a guess could turn a busy GPU idle), and the report says why."""
    s, e = _window()
    got = {}
    for tag, value in (("percent", 80), ("ratio", 0.8), ("ambiguous", 1)):
        case = f"c{uuid.uuid4().hex[:8]}"
        labels = _gpu(case, 0, pod="p", namespace="ns")
        prometheus.backfill(_om([("DCGM_FI_DEV_GPU_UTIL_RATIO", labels, _const(s, e, value))]))
        res = PrometheusSource(prometheus.url, matchers={"case": case}).read(Window(_utc(s), _utc(e)), WIDTH)
        got[tag] = (sorted({round(b.mean, 9) for b in res.buckets}), res.report.labels["naming"], res.report.warnings)
    assert got["percent"][:2] == ([0.8], "dcgm-4.6")
    assert got["ratio"][:2] == ([0.8], "exporter-4.9")
    assert got["ambiguous"][0] == []
    assert any("cannot tell a percent" in w and "left unread" in w for w in got["ambiguous"][2])


def test_a_percent_under_the_4_9_naming_is_garbage_not_a_ratio(prometheus):
    """With 4.9's names present, a DCGM_FI_DEV_GPU_UTIL_RATIO of 80 is out of range: dropped and
    counted, never read as 80 × 100 %."""
    case = f"c{uuid.uuid4().hex[:8]}"
    s, e = _window()
    labels = _gpu(case, 0, pod="p", namespace="ns")
    prometheus.backfill(
        _om(
            [
                ("DCGM_FI_DEV_GPU_UTIL_RATIO", labels, _const(s, e, 80)),
                ("DCGM_FI_DEV_SM_CLOCK_HERTZ", labels, _const(s, e, 1.98e9)),
            ]
        )
    )
    res = PrometheusSource(prometheus.url, matchers={"case": case}).read(Window(_utc(s), _utc(e)), WIDTH)
    util = [b for b in res.buckets if b.metric is Metric.GPU_UTIL]
    assert util and all(b.count == 0 for b in util)
    assert res.report.dropped[Metric.GPU_UTIL] == 6 * 20


def test_garbage_dropped_counted_and_overshoot_clamped(prometheus):
    case = f"c{uuid.uuid4().hex[:8]}"
    s, e = _window()
    labels = _gpu(case, 0, pod="p", namespace="ns")
    util = _const(s, e, 50)
    # three garbage samples in the second bucket, one in the fifth
    bad = {s + 300 + 15: 4294967295, s + 300 + 30: float("nan"), s + 300 + 45: -1, s + 1200: 4294967295}
    util = [(t, bad.get(t, v)) for t, v in util]
    sm = [(t, 1.03 if t == s + 600 else 0.5) for t, _ in _const(s, e, 0)]
    prometheus.backfill(_om([("DCGM_FI_DEV_GPU_UTIL", labels, util), ("DCGM_FI_PROF_SM_ACTIVE", labels, sm)]))

    src = PrometheusSource(prometheus.url, matchers={"case": case})
    res = src.read(Window(_utc(s), _utc(e)), WIDTH)
    ub = sorted(_by(res.buckets, Metric.GPU_UTIL), key=lambda b: b.start)
    assert [b.count for b in ub] == [20, 17, 20, 20, 19, 20]
    assert [b.dropped for b in ub] == [0, 3, 0, 0, 1, 0]
    assert all(b.mean == pytest.approx(0.5) and b.maximum <= 1.0 for b in ub)
    assert res.report.dropped == {Metric.GPU_UTIL: 4}
    smb = sorted(_by(res.buckets, Metric.SM_ACTIVE), key=lambda b: b.start)
    assert smb[2].maximum == 1.0  # 1.03 clamped, not dropped
    assert smb[2].total == pytest.approx(19 * 0.5 + 1.0) and smb[2].dropped == 0


def test_mig_series(prometheus):
    case = f"c{uuid.uuid4().hex[:8]}"
    s, e = _window()
    series = []
    for gi, prof, pod in (("1", "3g.71gb", "a"), ("2", "1g.18gb", "b")):
        labels = _gpu(case, 0, GPU_I_ID=gi, GPU_I_PROFILE=prof, pod=pod, namespace="mig")
        series.append(("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, _const(s, e, 0.9)))
        series.append(("DCGM_FI_PROF_SM_ACTIVE", labels, _const(s, e, 0.7)))
    prometheus.backfill(_om(series))
    res = PrometheusSource(prometheus.url, matchers={"case": case}).read(Window(_utc(s), _utc(e)), WIDTH)
    gpus = {b.pod.pod: b.gpu for b in res.buckets}
    assert gpus["a"].key == f"GPU-{case}-0/1" and gpus["a"].mig_profile == "3g.71gb"
    assert gpus["a"].fraction == pytest.approx(3 / 7)
    assert gpus["b"].instance == "2"
    assert res.report.present == {Metric.GR_ENGINE_ACTIVE, Metric.SM_ACTIVE}
    assert res.report.labels.get("mig") == "GPU_I_ID"


def test_query_count_does_not_grow_with_pods(prometheus):
    s, e = _window()
    cases = {}
    for n in (2, 60):
        case = f"c{uuid.uuid4().hex[:8]}"
        series = []
        for i in range(n):
            labels = _gpu(case, i, pod=f"job-{i}", namespace=f"ns-{i % 5}")
            for name, v in (
                ("DCGM_FI_DEV_GPU_UTIL", 90),
                ("DCGM_FI_PROF_SM_ACTIVE", 0.6),
                ("DCGM_FI_PROF_DRAM_ACTIVE", 0.2),
            ):
                series.append((name, labels, _const(s, e, v, step=30)))
        cases[n] = case
        prometheus.backfill(_om(series))
    counted = {}
    for n, case in cases.items():
        src = PrometheusSource(prometheus.url, matchers={"case": case})
        before = _requests_total(prometheus.url)
        res = src.read(Window(_utc(s), _utc(e)), WIDTH)
        after = _requests_total(prometheus.url)
        assert len({b.pod for b in res.buckets}) == n
        assert after - before == res.report.queries
        counted[n] = res.report.queries
    assert counted[2] == counted[60]
    assert counted[2] == 2 + 4 * 3  # buildinfo, names, sum/count/min/max per present name


def test_time_split_under_points_limit_gives_same_buckets(prometheus):
    case = f"c{uuid.uuid4().hex[:8]}"
    s, e = _window()
    labels = _gpu(case, 0, pod="p", namespace="ns")
    prometheus.backfill(_om([("DCGM_FI_DEV_GPU_UTIL", labels, [(t, (t // 15) % 100) for t in range(s, e, 15)])]))
    w = Window(_utc(s), _utc(e))
    whole = PrometheusSource(prometheus.url, matchers={"case": case}).read(w, WIDTH)
    split = PrometheusSource(prometheus.url, matchers={"case": case}, max_points=3).read(w, WIDTH)
    assert split.report.queries == whole.report.queries + 2 * 4  # 6 buckets in runs of 2, 4 aggregates each
    assert [(b.start, b.total, b.count) for b in split.buckets] == [(b.start, b.total, b.count) for b in whole.buckets]


def test_unreachable_prometheus_names_the_url():
    with socket_port() as port:
        src = PrometheusSource(f"http://127.0.0.1:{port}", retries=0, timeout=3)
        with pytest.raises(SourceUnavailable, match=f"127.0.0.1:{port}.*unreachable"):
            src.read(Window(*map(_utc, _window())), WIDTH)


def test_refused_query_carries_prometheus_error(prometheus):
    client = PrometheusClient(prometheus.url)
    with pytest.raises(QueryRefused, match="parse error"):
        client.query("sum(")


def test_bad_url_is_bad_input():
    with pytest.raises(BadInput):
        PrometheusSource("prometheus:9090")


def test_promql_helpers():
    assert promql.range_ms(300_000, 2) == 299_999 and promql.range_ms(300_000, 3) == 300_000
    assert promql.chunks(10, 70, 10, max_steps=3) == [(10, 30), (40, 60), (70, 70)]
    assert promql.regex_alternation(["GPU-a.b", "x|y"]) == r"GPU-a\.b|x\|y"
    assert promql.selector("m", {"a": 'q"x'}, {"b": "1|2"}) == 'm{a="q\\"x",b=~"1|2"}'
    assert promql.format_ts(1767225899999) == "1767225899.999"
    conv = promql.detect_convention([{"pod": "dcgm-exporter-1"}, {"pod": "dcgm-exporter-1", "exported_pod": "w"}])
    assert conv.pod == "exported_pod" and conv.container == "exported_container"
    assert promql.gpu_of({"Hostname": "n1", "device": "nvidia3"}).uuid == "n1:3"
    assert re.fullmatch(promql.regex_alternation(["a-b"]), "a-b")


class socket_port:
    """A loopback port nothing listens on (bound, then released)."""

    def __enter__(self) -> int:
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        return self.port

    def __exit__(self, *exc: object) -> None:
        return None


def _utc(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, timezone.utc)


# -- auth and TLS against a real Prometheus started with a web config --------------------------------


def _bcrypt(password: str) -> str:
    try:
        import bcrypt  # type: ignore[import-not-found]

        return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
    except ImportError:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt

        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))


def _tls_files(d) -> tuple[str, str, str]:
    """A throwaway CA and a server certificate for 127.0.0.1 (PEM files)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.now(timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-auditor test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = (d / "ca.pem", d / "server.pem", d / "server.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return tuple(str(p) for p in paths)  # type: ignore[return-value]


def _free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class _OwnPrometheus:
    """A Prometheus this test starts itself, for server settings the shared one cannot have."""

    def __init__(self, root, args: list[str], *, scheme: str = "http", ssl_context=None) -> None:
        import shutil
        import subprocess

        binary = shutil.which("prometheus")
        assert binary, "the Debian prometheus package is needed (make system-deps)"
        (root / "prom.yml").write_text("global: {scrape_interval: 15s}\n")
        port = _free_port()
        self.url = f"{scheme}://127.0.0.1:{port}"
        self.log_path = root / "log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={root}/prom.yml",
                f"--storage.tsdb.path={root}/data",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=3650d",
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "/-/ready", context=ssl_context, timeout=2)
                break
            except urllib.error.HTTPError as exc:  # 401: up, wants credentials
                if exc.code == 401:
                    break
            except OSError:
                pass
            assert self.proc.poll() is None, self.log_path.read_text()
            assert time.time() < deadline, "Prometheus did not start: " + self.log_path.read_text()
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self._log.close()


@pytest.fixture
def secured_prometheus(tmp_path):
    """A second real Prometheus serving HTTPS with basic auth (user ``auditor``, password ``s3cret``)."""
    import ssl

    ca, cert, key = _tls_files(tmp_path)
    (tmp_path / "web.yml").write_text(
        f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
        f"basic_auth_users:\n  auditor: '{_bcrypt('s3cret')}'\n"
    )
    server = _OwnPrometheus(
        tmp_path,
        [f"--web.config.file={tmp_path}/web.yml"],
        scheme="https",
        ssl_context=ssl.create_default_context(cafile=ca),
    )
    try:
        yield server.url, ca
    finally:
        server.stop()


def test_sample_limit_splits_the_query_by_time(tmp_path):
    """A Prometheus with a tiny --query.max-samples refuses the whole range; halves pass."""
    import shutil
    import subprocess

    case = "limits"
    s, e = _window()
    series = [("DCGM_FI_DEV_GPU_UTIL", _gpu(case, i, pod=f"p{i}", namespace="ns"), _const(s, e, 40)) for i in range(10)]
    (tmp_path / "in.om").write_text(_om(series))
    promtool = shutil.which("promtool")
    assert promtool
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp_path / "in.om"), str(tmp_path / "data")],
        check=True,
        capture_output=True,
    )
    server = _OwnPrometheus(tmp_path, ["--query.max-samples=60"])
    try:
        src = PrometheusSource(server.url, matchers={"case": case})
        with pytest.raises(QueryRefused, match="too many samples"):
            src.client.query_range(
                'count_over_time(DCGM_FI_DEV_GPU_UTIL{case="limits"}[299999ms])',
                (s + 300) * 1000 - 1,
                e * 1000 - 1,
                300_000,
            )
        res = src.read(Window(_utc(s), _utc(e)), WIDTH)
        assert len(res.buckets) == 60 and {b.count for b in res.buckets} == {20}
        assert all(b.mean == pytest.approx(0.4) for b in res.buckets)
        assert res.report.queries > 2 + 4  # the refused ranges were split and re-asked
    finally:
        server.stop()


def test_tls_and_basic_auth(secured_prometheus):
    url, ca = secured_prometheus
    ok = PrometheusClient(url, basic_auth=("auditor", "s3cret"), ca_file=ca, retries=0)
    assert ok.buildinfo().get("version")
    assert ok.query("vector(1)")["result"][0]["value"][1] == "1"
    insecure = PrometheusClient(url, basic_auth=("auditor", "s3cret"), insecure=True, retries=0)
    assert insecure.query("vector(1)")["resultType"] == "vector"
    with pytest.raises(SourceUnavailable, match="TLS"):
        PrometheusClient(url, basic_auth=("auditor", "s3cret"), retries=0).query("vector(1)")
    with pytest.raises(QueryRefused, match="HTTP 401"):
        PrometheusClient(url, basic_auth=("auditor", "wrong"), ca_file=ca, retries=0).query("vector(1)")
    with pytest.raises(QueryRefused, match="HTTP 401"):
        PrometheusClient(url, bearer_token="not-accepted-here", ca_file=ca, retries=0).query("vector(1)")


def test_cli_auth_flags_reach_a_secured_prometheus(secured_prometheus, tmp_path, capsys, monkeypatch):
    from auditor.cli.main import main

    url, ca = secured_prometheus
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    rc = main(
        [
            "doctor",
            "--prometheus",
            url,
            "--prometheus-user",
            "auditor",
            "--prometheus-password-file",
            str(pw),
            "--prometheus-ca-file",
            ca,
            "--output",
            "json",
        ]
    )
    checks = {c["name"]: c for c in __import__("json").loads(capsys.readouterr().out)}
    assert checks["Prometheus reachable"]["status"] == "ok"
    assert rc == 1 and checks["DCGM series present"]["status"] == "fail"  # an empty server
    monkeypatch.setenv("GPU_AUDITOR_PROMETHEUS_PASSWORD", "wrong")
    rc = main(["doctor", "--prometheus", url, "--prometheus-user", "auditor", "--prometheus-ca-file", ca])
    assert rc == 1 and "HTTP 401" in capsys.readouterr().out
    assert (
        main(
            [
                "doctor",
                "--prometheus",
                url,
                "--prometheus-user",
                "auditor",
                "--prometheus-ca-file",
                str(tmp_path / "nope"),
            ]
        )
        == 2
    )


def test_duplicate_series_are_not_double_counted(prometheus):
    """An HA pair or two scrape jobs give the same GPU twice (differing in instance)."""
    case = f"c{uuid.uuid4().hex[:8]}"
    s, e = _window()
    series = [
        ("DCGM_FI_DEV_GPU_UTIL", _gpu(case, 0, pod="p", namespace="ns", instance="10.0.0.1:9400"), _const(s, e, 60)),
        (
            "DCGM_FI_DEV_GPU_UTIL",
            _gpu(case, 0, pod="p", namespace="ns", instance="10.0.0.2:9400"),
            _const(s + 300, e, 60),
        ),
    ]
    prometheus.backfill(_om(series))
    res = PrometheusSource(prometheus.url, matchers={"case": case}).read(Window(_utc(s), _utc(e)), WIDTH)
    assert len(res.buckets) == 6 and {b.count for b in res.buckets} == {20}
    assert any("duplicate series" in w for w in res.report.warnings)
