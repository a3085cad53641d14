"""The store: jobs, the per-GPU bucket rollup, job summaries and audit runs (docs/store.md)."""

from auditor.store.store import Store
from auditor.store.urls import default_path, default_url, display_url

__all__ = ["Store", "default_path", "default_url", "display_url"]
