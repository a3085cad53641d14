"""The test bed's state file: what runs, under which pid, with which command, where it logs.

Written after each component starts (not only at the end), so ``down`` can stop whatever a failed
``up`` left running.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_VERSION = 1


@dataclass
class Proc:
    """One server process the test bed started."""

    name: str
    pid: int
    argv: list[str]
    log: str
    marker: str  # a string in its command line, checked before signalling a recorded pid
    stop_signal: int = 15
    user: str | None = None
    ports: dict[str, int] = field(default_factory=dict)


@dataclass
class State:
    dir: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def file(self) -> Path:
        return self.dir / "state.json"

    def record(self, proc: Proc) -> None:
        with self._lock:
            self.procs[proc.name] = proc
            self._save()

    def set(self, **values: Any) -> None:
        with self._lock:
            self.values.update(values)
            self._save()

    def _save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        data = {
            "version": STATE_VERSION,
            "procs": {k: asdict(v) for k, v in self.procs.items()},
            "values": self.values,
        }
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, self.file)

    def save(self) -> None:
        with self._lock:
            self._save()

    @classmethod
    def load(cls, directory: Path) -> "State | None":
        path = directory / "state.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if data.get("version") != STATE_VERSION:
            return None
        procs = {k: Proc(**v) for k, v in data.get("procs", {}).items()}
        return cls(dir=directory, procs=procs, values=dict(data.get("values", {})))
