"""Where the store lives: turning what users type (``--db``) into a SQLAlchemy URL, and back
into something safe to print.

Users and the test bed hand us libpq URLs (``postgresql://user:pw@host:5432/db``), the form
every PostgreSQL tool understands; SQLAlchemy would pick the psycopg2 driver for those, which is
not installed, so they are mapped to psycopg 3. Every message that names a database goes through
:func:`display_url` (the one URL masker, :func:`auditor.redact.mask_url`), so a password never
reaches a log or a terminal.
"""

from __future__ import annotations

from pathlib import Path

import platformdirs
import sqlalchemy as sa
from sqlalchemy.engine import URL

from auditor.errors import BadInput
from auditor.redact import mask_url

APP_NAME = "gpu-auditor"
DB_FILENAME = "auditor.db"

_POSTGRES_SCHEMES = {"postgresql", "postgres", "postgresql+psycopg"}


def default_path() -> Path:
    """The default SQLite file: ``auditor.db`` in the user's data directory (platformdirs)."""
    return Path(platformdirs.user_data_dir(APP_NAME)) / DB_FILENAME


def default_url() -> str:
    """``sqlite:///`` URL of :func:`default_path`."""
    return f"sqlite:///{default_path()}"


def resolve(url: str | None) -> URL:
    """Parse a store location into a SQLAlchemy URL with the driver we ship.

    ``None`` → the default SQLite file; ``sqlite:///path`` (``sqlite://`` alone is an in-memory
    database, for tests); ``postgresql://`` / ``postgres://`` → ``postgresql+psycopg://``. A bare
    filesystem path is taken as a SQLite file, since that is what ``--db ./x.db`` means.
    """
    if url is None:
        return sa.make_url(default_url())
    text = url.strip()
    if not text:
        raise BadInput("store URL is empty (use sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DB)")
    if "://" not in text:
        return sa.make_url(f"sqlite:///{Path(text).expanduser().absolute()}")
    try:
        parsed = sa.make_url(text)
    except sa.exc.ArgumentError as exc:
        raise BadInput(f"store URL {mask_url(text)} is not a database URL: {exc}") from None
    if parsed.drivername in _POSTGRES_SCHEMES:
        return parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername == "sqlite" or parsed.drivername.startswith("postgresql+"):
        return parsed
    raise BadInput(
        f"store URL {display_url(parsed)}: unsupported database {parsed.drivername!r} "
        "(use sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DB)"
    )


def display_url(url: URL | str) -> str:
    """The URL with its password (in the user part or a ``password=`` query parameter) masked."""
    if isinstance(url, str):
        return mask_url(url)
    return mask_url(url.render_as_string(hide_password=False))


def secrets_of(url: URL) -> list[str]:
    """Strings that must never appear in a message about this URL (its passwords)."""
    out = []
    if url.password:
        out.append(str(url.password))
    q = url.query.get("password")
    if q:
        out.extend([q] if isinstance(q, str) else list(q))
    return [s for s in out if s]
