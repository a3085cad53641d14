"""SQL for upserts of stored spans, which only ever widen (an older window never narrows one)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa


def earlier(new: Any, old: Any) -> Any:
    """The earlier of an upsert's new and stored value (SQL): stored spans only ever widen."""
    return sa.case((new < old, new), else_=old)


def later(new: Any, old: Any) -> Any:
    return sa.case((new > old, new), else_=old)
