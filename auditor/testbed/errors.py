"""The test bed's error: which component failed, why, and where its log is."""

from __future__ import annotations

from pathlib import Path

from auditor.errors import AuditorError


def log_tail(path: Path | None, lines: int = 15) -> str:
    """The last lines of a log, to put the likely cause right into the error message."""
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


class TestbedError(AuditorError):
    """A test-bed component could not be built, started or reached."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, component: str, cause: str, log: Path | None = None) -> None:
        self.component = component
        self.cause = cause
        self.log = log
        message = f"test bed: {component} failed: {cause}"
        if log is not None:
            message += f" (log: {log})"
            tail = log_tail(log)
            if tail:
                message += "\n--- last lines of the log ---\n" + tail
        super().__init__(message)
