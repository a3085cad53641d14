"""The running agent: a sampling thread, an attribution thread and the ``/metrics`` HTTP server.

- **Sampling** (every ``interval``, 1 s by default, on a fixed schedule that does not drift):
  one :meth:`GpuSampler.sample` call, tagged with each device's owner at that moment, into the
  :class:`~auditor.agent.window.SampleWindow`. The thread's own CPU time is measured around the
  call (``gpu_auditor_agent_sample_cpu_seconds_total``), which is how the validation reports the
  agent's cost per GPU per sample.
- **Attribution** (every ``refresh`` s): the kubelet's pod-resources ``List``. On failure the last
  good answer is kept for ``stale_after`` seconds, then GPUs are served without pod labels
  (unattributed rather than wrongly attributed); failures are counted and logged.
- **Serving**: ``/metrics`` renders the means since the scraper's previous scrape with
  prometheus_client's exposition (text format, or OpenMetrics when asked), every field at every
  scrape (a field the source computes less often than every tick serves its last computed value
  between computations: :class:`~auditor.agent.window.SampleWindow`), ``/healthz`` answers 200
  while samples are fresh.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Callable, Iterable

from auditor import __version__
from auditor.agent.fields import FIELDS
from auditor.agent.podresources import PodResourcesClient, attribute
from auditor.agent.sampler import Device, GpuSampler
from auditor.agent.window import SampleWindow, Tick
from auditor.clock import SYSTEM_CLOCK
from auditor.core.model import PodRef
from auditor.core.source_preference import SOURCE_LABEL, SOURCE_VALUE
from auditor.errors import BadInput

if TYPE_CHECKING:
    from auditor.ports import Clock

log = logging.getLogger(__name__)

DEVICE_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
POD_LABELS = ("container", "namespace", "pod")


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` (``:9400`` and ``[::1]:9400`` too) → (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadInput(f"--listen {value!r}: expected HOST:PORT, e.g. 0.0.0.0:9400")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def parse_seconds(value: str, flag: str) -> float:
    """``1s``, ``500ms``, ``2`` → seconds (> 0)."""
    v = value.strip().lower()
    try:
        if v.endswith("ms"):
            secs = float(v[:-2]) / 1000.0
        elif v.endswith("s"):
            secs = float(v[:-1])
        elif v.endswith("m"):
            secs = float(v[:-1]) * 60.0
        else:
            secs = float(v)
    except ValueError:
        raise BadInput(f"{flag} {value!r}: expected a duration such as 1s or 500ms") from None
    if not secs > 0:
        raise BadInput(f"{flag} {value!r}: must be positive")
    return secs


class Agent:
    """Samples a :class:`GpuSampler`, attributes devices to pods and renders dcgm-exporter-format metrics."""

    def __init__(
        self,
        sampler: GpuSampler,
        *,
        node_name: str | None = None,
        interval: float = 1.0,
        pod_resources: PodResourcesClient | Callable[[], Iterable[Any]] | None = None,
        refresh: float = 5.0,
        stale_after: float = 60.0,
        keep: float = 600.0,
        first_window: float = 15.0,
        hold: float | None = None,
        extra_resources: tuple[str, ...] = (),
        clock: Callable[[], float] = time.time,
        timer: "Clock" = SYSTEM_CLOCK,
    ) -> None:
        self.sampler = sampler
        self.node_name = node_name or os.environ.get("NODE_NAME") or socket.gethostname()
        self.interval = interval
        self.refresh = refresh
        self.stale_after = stale_after
        self.extra_resources = extra_resources
        self.clock = clock
        #: paces the sampling loop (monotonic time and its waits), so a fake one runs it at once
        self.timer = timer
        self.devices: list[Device] = sampler.devices()
        self._list = pod_resources.list if isinstance(pod_resources, PodResourcesClient) else pod_resources
        self._pod_client = pod_resources if isinstance(pod_resources, PodResourcesClient) else None
        if hold is None:
            # a field computed every k ticks is absent from the k-1 between: hold its last value
            # one computation period and a tick more, so every scrape serves it (never longer:
            # a field the source stopped computing disappears rather than go stale)
            hold = interval * (getattr(sampler, "computed_every", 1) + 1)
        self.window = SampleWindow(keep=keep, first_window=first_window, hold=hold)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._owners: dict[str, PodRef] = {}
        self._owners_at = 0.0
        self.server: ThreadingHTTPServer | None = None
        # self-metrics
        self.samples = 0
        self.sample_errors = 0
        self.sample_cpu = 0.0
        self.sample_wall = 0.0
        self.attribution_errors = 0
        self.attribution_ok_at = 0.0
        self._last_warnings: set[str] = set()

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the sampling thread (and the attribution thread when a pod-resources client is set)."""
        if self._list is not None:
            self.refresh_owners()  # first attribution before the first sample
            self._spawn("pod-resources", self._attribution_loop)
        self._spawn("sampler", self._sampling_loop)

    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Serve ``/metrics`` on ``host:port`` in a background thread; returns the bound address."""
        agent = self

        class Handler(BaseHTTPRequestHandler):
            server_version = f"gpu-auditor-agent/{__version__}"

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    scraper = f"{self.client_address[0]} {self.headers.get('User-Agent', '')}"
                    body, ctype = agent.render(scraper, self.headers.get("Accept", ""))
                    self._reply(200, body, ctype)
                elif path in ("/healthz", "/readyz"):
                    ok, why = agent.healthy()
                    self._reply(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8")
                elif path == "/":
                    self._reply(200, b"gpu-auditor node agent: /metrics, /healthz\n", "text/plain; charset=utf-8")
                else:
                    self._reply(404, b"not found\n", "text/plain; charset=utf-8")

            def _reply(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("%s " + fmt, self.client_address[0], *args)

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

        self.server = Server((host, port), Handler)
        self._spawn("http", self.server.serve_forever)
        bound_host, bound_port = self.server.server_address[:2]
        return str(bound_host), int(bound_port)

    def stop(self) -> None:
        self._stop.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []
        if self._pod_client is not None:
            self._pod_client.close()
        self.sampler.close()

    def wait(self) -> None:
        """Block until :meth:`stop` (or a signal) ends the agent."""
        while not self._stop.wait(1.0):
            pass

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name=f"agent-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    # -- sampling -----------------------------------------------------------------------------
    def _sampling_loop(self) -> None:
        next_at = self.timer.monotonic()
        while not self._stop.is_set():
            self.tick()
            next_at += self.interval
            delay = next_at - self.timer.monotonic()
            if delay < 0:  # fell behind (a slow read): skip missed ticks rather than burst
                next_at = self.timer.monotonic()
                delay = 0.0
            if self.timer.wait(self._stop, delay):
                break

    def tick(self) -> None:
        """Take one sample of every device now (the sampling thread calls this every interval)."""
        c0, w0 = time.thread_time(), time.perf_counter()
        try:
            values = self.sampler.sample()
        except Exception as exc:  # noqa: BLE001 - a failed tick is counted; the agent keeps running
            self.sample_errors += 1
            if self.sample_errors == 1 or self.sample_errors % 60 == 0:
                log.warning("sampling failed (%d times so far): %s", self.sample_errors, exc)
            return
        finally:
            self.sample_cpu += time.thread_time() - c0
            self.sample_wall += time.perf_counter() - w0
        now = self.clock()
        with self._lock:
            owners = self._current_owners(now)
            tick = Tick(now, {key: (owners.get(key), vals) for key, vals in values.items()})
            self.window.add(tick)
            self.samples += 1

    # -- attribution --------------------------------------------------------------------------
    def _attribution_loop(self) -> None:
        while not self._stop.wait(self.refresh):
            self.refresh_owners()

    def refresh_owners(self) -> None:
        """Ask the kubelet who holds which device; keep the last good answer on failure."""
        if self._list is None:
            return
        try:
            allocs = list(self._list())
        except Exception as exc:  # noqa: BLE001 - the kubelet may restart; keep serving
            self.attribution_errors += 1
            log.warning("pod attribution failed (keeping the last answer for up to %.0f s): %s", self.stale_after, exc)
            return
        owners, warnings = attribute(allocs, self.devices, self.extra_resources)
        for w in set(warnings) - self._last_warnings:
            log.warning("%s", w)
        self._last_warnings = set(warnings)
        with self._lock:
            self._owners = owners
            self._owners_at = self.clock()
            self.attribution_ok_at = self._owners_at

    def _current_owners(self, now: float) -> dict[str, PodRef]:
        if self._list is None:
            return {}
        if now - self._owners_at > self.stale_after:
            return {}
        return self._owners

    # -- serving ------------------------------------------------------------------------------
    def healthy(self) -> tuple[bool, str]:
        latest = self.window.latest
        if latest is None:
            return False, "no sample yet"
        age = self.clock() - latest.t
        if age > max(5 * self.interval, 10.0):
            return False, f"last sample {age:.0f} s old"
        return True, "ok"

    def families(self, scraper: str) -> list[Any]:
        """The metric families for one scrape (prometheus_client objects)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        now = self.clock()
        with self._lock:
            means, n_ticks = self.window.take(scraper, now, max_age=max(3 * self.interval, 5.0))
        by_key = {d.key: d for d in self.devices}
        fams = {f.name: GaugeMetricFamily(f.name, f.help, labels=None) for f in FIELDS}
        for (key, owner), fields in sorted(means.items(), key=lambda kv: (kv[0][0], kv[0][1] or PodRef("", ""))):
            dev = by_key.get(key)
            if dev is None:
                continue
            labels = self._labels(dev, owner)
            for name, mean in fields.items():
                fam = fams.get(name)
                if fam is not None and mean.n:
                    fam.samples.append(_sample(name, labels, mean.value))
        out: list[Any] = [f for f in fams.values() if f.samples]
        info = GaugeMetricFamily(
            "gpu_auditor_agent_info",
            "The node agent: its GPU backend and version.",
            labels=["backend", "version", "Hostname"],
        )
        info.add_metric([self.sampler.name, __version__, self.node_name], 1.0)
        samples = CounterMetricFamily("gpu_auditor_agent_samples", "Sampling ticks taken (each reads every GPU once).")
        samples.add_metric([], float(self.samples))
        errors = CounterMetricFamily("gpu_auditor_agent_sample_errors", "Sampling ticks that failed.")
        errors.add_metric([], float(self.sample_errors))
        cpu = CounterMetricFamily(
            "gpu_auditor_agent_sample_cpu_seconds",
            "CPU time of the sampling thread spent reading the GPUs (divide by samples and GPUs for the cost per GPU per sample).",
        )
        cpu.add_metric([], self.sample_cpu)
        gpus = GaugeMetricFamily("gpu_auditor_agent_devices", "GPUs and MIG instances the agent samples.")
        gpus.add_metric([], float(len(self.devices)))
        window = GaugeMetricFamily("gpu_auditor_agent_window_samples", "Samples averaged into this scrape's values.")
        window.add_metric([], float(n_ticks))
        attr_err = CounterMetricFamily(
            "gpu_auditor_agent_pod_resources_errors", "Failed kubelet pod-resources List calls."
        )
        attr_err.add_metric([], float(self.attribution_errors))
        out += [info, samples, errors, cpu, gpus, window, attr_err]
        if self.attribution_ok_at:
            ok = GaugeMetricFamily(
                "gpu_auditor_agent_pod_resources_last_success_timestamp_seconds",
                "When the kubelet last answered pod-resources List.",
            )
            ok.add_metric([], self.attribution_ok_at)
            out.append(ok)
        return out

    def render(self, scraper: str, accept: str = "") -> tuple[bytes, str]:
        """The exposition body and its content type for one scrape."""
        from prometheus_client import CollectorRegistry
        from prometheus_client.exposition import choose_encoder

        fams = self.families(scraper)

        class _Once:
            def collect(self) -> list[Any]:
                return fams

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Once())
        encoder, ctype = choose_encoder(accept)
        return encoder(registry), ctype

    def _labels(self, dev: Device, owner: PodRef | None) -> dict[str, str]:
        labels = {
            "gpu": str(dev.index),
            "UUID": dev.uuid,
            "pci_bus_id": dev.pci_bus_id,
            "device": f"nvidia{dev.index}",
            "modelName": dev.model,
            "Hostname": self.node_name,
        }
        if dev.is_mig:
            labels["GPU_I_PROFILE"] = dev.gi_profile
            labels["GPU_I_ID"] = dev.gi_id
        if owner is not None:
            labels["container"] = owner.container
            labels["namespace"] = owner.namespace
            labels["pod"] = owner.pod
        labels[SOURCE_LABEL] = SOURCE_VALUE
        return labels


def _sample(name: str, labels: dict[str, str], value: float) -> Any:
    from prometheus_client.samples import Sample

    return Sample(name, labels, value)
