"""Metric sources: each reads DCGM-style telemetry from one place and yields rollup buckets."""
