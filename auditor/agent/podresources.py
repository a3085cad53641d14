"""Which pod holds which GPU: the kubelet's pod-resources gRPC API (v1 ``List``) over its unix socket.

The kubelet serves ``v1.PodResourcesLister`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``.
``List`` returns, per pod and container, the device IDs each device plugin handed out: GPU UUIDs
for ``nvidia.com/gpu`` (or indexes, with the plugin's ``--device-id-strategy=index``), ``MIG-…``
UUIDs for ``nvidia.com/mig-<profile>`` (and for ``nvidia.com/gpu`` under the ``single`` MIG
strategy), with a ``::<n>`` suffix per replica under time-slicing.

**The messages are our own definitions** of the v1 wire format, built at runtime with protobuf's
``descriptor_pb2`` — only the fields the agent reads (pod name/namespace, container name, device
resource name and ids; protobuf skips the others). No proto file or generated code of the kubelet
is in the repository; the tests generate a real server from the kubelet's own published proto
(``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``) and check the two agree on the wire.

:func:`attribute` (pure) turns the answer into device key → pod; :class:`PodResourcesClient`
does the I/O.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from auditor.agent.sampler import Device
from auditor.core.model import PodRef
from auditor.errors import SourceUnavailable

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
#: dcgm-exporter's limit on the answer's size (a node with many pods and CPUs answers big)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: device-plugin resources mapped by default: ``nvidia.com/gpu`` and every ``nvidia.com/mig-*``
DEFAULT_RESOURCES = ("nvidia.com/gpu",)
_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-")


@dataclass(frozen=True, slots=True)
class Allocation:
    """One container's devices of one resource, as ``List`` reports them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@functools.lru_cache(maxsize=1)
def messages() -> tuple[Any, Any]:
    """(ListPodResourcesRequest, ListPodResourcesResponse) classes, defined here at runtime
    (so they have no static type: protobuf builds them from the descriptors below).

    Field numbers and types follow the kubelet's published v1 API; the descriptors go into a
    private pool so they never clash with a generated module of the same package.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(
        name="gpu_auditor/podresources_v1_subset.proto", package="v1", syntax="proto3"
    )

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label, json_name=_camel(fname))
            if type_name:
                f.type_name = type_name

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("ListPodResourcesRequest")
    message("ListPodResourcesResponse", ("pod_resources", 1, F.TYPE_MESSAGE, rep, ".v1.PodResources"))
    message(
        "PodResources",
        ("name", 1, F.TYPE_STRING, opt, ""),
        ("namespace", 2, F.TYPE_STRING, opt, ""),
        ("containers", 3, F.TYPE_MESSAGE, rep, ".v1.ContainerResources"),
    )
    message(
        "ContainerResources",
        ("name", 1, F.TYPE_STRING, opt, ""),
        ("devices", 2, F.TYPE_MESSAGE, rep, ".v1.ContainerDevices"),
    )
    message(
        "ContainerDevices",
        ("resource_name", 1, F.TYPE_STRING, opt, ""),
        ("device_ids", 2, F.TYPE_STRING, rep, ""),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return _message_class(pool, "v1.ListPodResourcesRequest"), _message_class(pool, "v1.ListPodResourcesResponse")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _message_class(pool: Any, full_name: str) -> type:
    from google.protobuf import message_factory

    desc = pool.FindMessageTypeByName(full_name)
    get = getattr(message_factory, "GetMessageClass", None)
    if get is not None:  # protobuf >= 4.21
        return get(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)  # pragma: no cover - old protobuf


def allocations(response: Any) -> list[Allocation]:
    """Flatten a ``ListPodResourcesResponse`` into :class:`Allocation` rows."""
    out = []
    for p in response.pod_resources:
        for c in p.containers:
            for d in c.devices:
                out.append(Allocation(p.namespace, p.name, c.name, d.resource_name, tuple(d.device_ids)))
    return out


def wanted(resource: str, extra: Sequence[str] = ()) -> bool:
    """Whether a device-plugin resource names NVIDIA GPUs or MIG devices (as dcgm-exporter maps them)."""
    return resource in DEFAULT_RESOURCES or bool(_MIG_RESOURCE.match(resource)) or resource in extra


def attribute(
    allocs: Iterable[Allocation], devices: Sequence[Device], extra_resources: Sequence[str] = ()
) -> tuple[dict[str, PodRef], list[str]]:
    """Device key → the pod (and container) holding it, plus warnings.

    A device ID may be a GPU UUID, a ``MIG-…`` UUID or a GPU index, optionally with a ``::<n>``
    time-slicing replica suffix. IDs that match no device of this node are reported. When more
    than one container holds a device (time-slicing) one is chosen deterministically (the first
    by namespace, pod, container) and a warning says so: exporting the device once per pod would
    count its GPU-hours several times.
    """
    lookup: dict[str, str] = {}
    for d in devices:
        if d.is_mig:
            lookup[d.mig_uuid] = d.key
        else:
            lookup[d.uuid] = d.key
            lookup[str(d.index)] = d.key
    holders: dict[str, set[PodRef]] = {}
    warnings: list[str] = []
    for a in allocs:
        if not wanted(a.resource, extra_resources):
            continue
        for raw in a.device_ids:
            dev_id = raw.split("::", 1)[0]
            key = lookup.get(dev_id)
            if key is None:
                warnings.append(f"{a.namespace}/{a.pod}: device {raw!r} of {a.resource} is not a GPU of this node")
                continue
            holders.setdefault(key, set()).add(PodRef(a.namespace, a.pod, a.container))
    out: dict[str, PodRef] = {}
    for key, pods in holders.items():
        chosen = min(pods)
        out[key] = chosen
        if len(pods) > 1:
            others = ", ".join(f"{p.namespace}/{p.pod}" for p in sorted(pods) if p != chosen)
            warnings.append(
                f"GPU {key} is shared (time-slicing?): attributed to {chosen.namespace}/{chosen.pod}, not {others}"
            )
    return out, warnings


class PodResourcesClient:
    """``List`` over the kubelet socket, with a reused channel and a timeout."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout: float = 10.0) -> None:
        try:
            import grpc
        except ImportError as exc:
            raise SourceUnavailable(f"grpcio is not installed ({exc}): pod attribution needs it") from None
        self._grpc = grpc
        self.socket_path = socket_path
        self.timeout = timeout
        try:
            request, response = messages()
        except ImportError as exc:
            raise SourceUnavailable(f"protobuf is not installed ({exc}): pod attribution needs it") from None
        self._request = request
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}",
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        self._list = self._channel.unary_unary(
            LIST_METHOD, request_serializer=request.SerializeToString, response_deserializer=response.FromString
        )

    def list(self) -> list[Allocation]:
        """Every pod's device allocations; raises :class:`SourceUnavailable` when the kubelet does not answer."""
        try:
            return allocations(self._list(self._request(), timeout=self.timeout))
        except self._grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            raise SourceUnavailable(f"pod-resources List on {self.socket_path} failed: {code}: {detail}") from None

    def close(self) -> None:
        self._channel.close()
