"""Names the user types on the command line, checked where argparse reads them.

A cluster name is recorded on every job and selects rows wherever several clusters share one
store. ``--cluster ''`` used to be taken: an audit recorded jobs under an empty cluster, and a
reading command treated the empty filter as "every cluster". It is refused (exit 2) like any
other bad flag (the settings' ``cluster`` is held to the same rule).
"""

from __future__ import annotations

import argparse

from auditor.render.safe_text import terminal_safe
from auditor.settings import check_cluster_name


def cluster_name(text: str) -> str:
    """``type=`` of every ``--cluster`` flag."""
    why = check_cluster_name(text)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{terminal_safe(text, 40)!r}: {why}")
    return text
