"""The node agent: per-GPU profiling metrics under dcgm-exporter's names, for nodes without one.

Many clusters run dcgm-exporter without its profiling counters (SM activity is off in every
shipped CSV), or no DCGM at all. The agent samples every GPU of its node once a second from the
best source present (pydcgm, else NVML GPM on Hopper and newer, else NVML utilization alone),
attributes each GPU (or MIG instance) to the pod holding it through the kubelet's pod-resources
API, and serves ``/metrics`` in dcgm-exporter's format, so the audit's queries work unchanged.
Each served value is the mean of the 1 s samples since the scraper's previous scrape, not a
point sample.

Nothing here imports pynvml, pydcgm, grpc, protobuf or prometheus_client at module level, and
nothing imports the audit's heavier dependencies (sqlmodel, kubernetes, requests): the agent
runs in a small container with only nvidia-ml-py, prometheus-client and grpcio installed.
"""
