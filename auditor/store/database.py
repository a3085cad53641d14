"""The store's database: engine and connection setup, schema migration, transactions, errors.

SQLite (a file in the user's data directory) by default, PostgreSQL by URL. Every database
failure leaves as :class:`auditor.errors.StoreError` naming the (password-masked) URL and the
operation, ``retryable`` when a retry can help (a connection drop, a locked file). The table
modules (jobs, buckets, claims, aggregates, summaries, runs, reports, decisions, ...) use only
:meth:`Database.reading`, :meth:`Database.writing` and :meth:`Database.checking`.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.util.exc import CommandError
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import URL, Connection, Engine

from auditor import redact
from auditor.errors import StoreError
from auditor.store import urls
from auditor.store.values import Invalid

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
#: The store's own version table, so a database shared with another alembic user stays distinct.
VERSION_TABLE = "gpu_auditor_schema_version"

_ALEMBIC_LOCK = threading.Lock()

#: Key of the PostgreSQL advisory lock held while migrating ("gpu-aud" in ASCII).
_MIGRATION_LOCK_KEY = 0x6770752D617564

# SQLite failures that go away by themselves; every other sqlite OperationalError ("no such
# table", "syntax error") is a bug or a foreign file and retrying will not help.
_SQLITE_TRANSIENT = re.compile(r"locked|busy|disk i/o|unable to open|readonly database|disk is full", re.I)
#: ... except when the file or its directory cannot be written by us: a permission, not a blip
_SQLITE_PERMISSION = re.compile(r"unable to open|readonly database", re.I)


class NoSchema(StoreError):
    """A store opened read-only that gpu-auditor never wrote (no schema at all): no jobs."""


class Database:
    """One engine with the store's transactions and error policy; safe to share between threads."""

    def __init__(self, engine: Engine, url: URL, *, read_only: bool = False) -> None:
        """Wrap an engine; use :meth:`open`, which also brings the schema up to date."""
        self.engine = engine
        self._url = url
        self.read_only = read_only
        self.display_url = urls.display_url(url)
        self._secrets = urls.secrets_of(url)
        for secret in self._secrets:
            redact.register_secret(secret)
        self._sqlite = engine.dialect.name == "sqlite"
        self._local = threading.local()
        self._insert = sqlite_dialect.insert if self._sqlite else pg_dialect.insert

    @classmethod
    def open(cls, url: str | None = None, *, read_only: bool = False) -> "Database":
        """Connect to the store at ``url`` and migrate its schema to this version's head.

        ``None`` is the default SQLite file in the user's data directory. Migrations run under a
        lock (PostgreSQL: an advisory lock; SQLite: an immediate write transaction), so two
        processes opening a fresh database at once both succeed and migrate it once.

        ``read_only`` (the commands that only read: explain, report, policy simulate, ...):
        nothing is written, so a store the user may only read (a read-only file or mount, a
        read-only database role) can be read; the schema is checked instead of migrated.
        """
        sa_url = urls.resolve(url)
        display = urls.display_url(sa_url)
        try:
            engine = _create_engine(sa_url, read_only=read_only)
        except (sa.exc.SQLAlchemyError, OSError) as exc:
            raise StoreError(f"store {display}: cannot open: {exc}") from exc
        db = cls(engine, sa_url, read_only=read_only)
        try:
            db._check_schema() if read_only else db._migrate()
        except BaseException:
            engine.dispose()
            raise
        return db

    def _check_schema(self) -> None:
        """A read-only store must already be at this version's schema: say how to get there."""
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
        head = ScriptDirectory.from_config(cfg).get_current_head()
        with self._guard("read the schema version"), self._connect() as conn:
            current = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
        if current is None:  # never written by gpu-auditor: nothing to read, and nothing is wrong
            raise NoSchema(f"store {self.display_url} holds no audited jobs (no gpu-auditor schema yet)")
        if current != head:
            raise StoreError(
                f"store {self.display_url}: its schema is at revision {current or 'none'}, this gpu-auditor "
                f"reads {head}; a command that only reads does not migrate it: run one that writes (`gpu-auditor "
                "audit`, the operator) with write access first"
            )

    def _migrate(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
        with self._guard("migrate the schema"):
            with self._connect(write=True, own=True) as conn:
                if not self._sqlite:
                    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
                else:
                    conn.exec_driver_sql("SELECT 1")  # starts the IMMEDIATE transaction: the lock
                cfg.attributes["connection"] = conn
                try:
                    with _ALEMBIC_LOCK:  # alembic's `context` is a module global: one at a time
                        command.upgrade(cfg, "head")
                except CommandError as exc:
                    raise StoreError(
                        f"store {self.display_url}: cannot migrate the schema: {exc} "
                        "(was this database written by a newer gpu-auditor?)"
                    ) from exc

    def close(self) -> None:
        """Release all connections. The object must not be used afterwards."""
        self.engine.dispose()

    @contextmanager
    def reading(self, what: str) -> Iterator[Connection]:
        """A read transaction; :meth:`auditor.store.Store.reading` says what it promises."""
        with self._guard(what), self._connect() as conn:
            yield conn

    @contextmanager
    def writing(self, what: str, *, own: bool = False) -> Iterator[Connection]:
        """A write transaction (``own``: outside any batch); see :meth:`auditor.store.Store.writing`."""
        with self._guard(what), self._connect(write=True, own=own) as conn:
            yield conn

    @contextmanager
    def checking(self, what: str) -> Iterator[None]:
        """Value checks outside a transaction; see :meth:`auditor.store.Store.checking`."""
        with self._guard(what):
            yield

    @property
    def is_sqlite(self) -> bool:
        """Whether the database is SQLite (some queries carry planner hints only it needs)."""
        return self._sqlite

    def insert(self, table: sa.Table) -> Any:
        """The dialect's ``INSERT`` for ``table``, with ``on_conflict_do_update/_nothing``."""
        return self._insert(table)

    def in_batch(self, conn: Connection) -> bool:
        """Whether ``conn`` is this thread's batch connection (its commit comes later)."""
        return getattr(self._local, "conn", None) is conn

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _connect(self, *, write: bool = False, own: bool = False) -> Iterator[Connection]:
        """A connection in a transaction that commits when the block succeeds and rolls back
        when it raises. Inside :meth:`batch` it is the batch's connection and a savepoint, so a
        failed call undoes only itself. On SQLite writers take the write lock up front
        (``BEGIN IMMEDIATE``) so two writers wait for each other instead of deadlocking."""
        shared = None if own else getattr(self._local, "conn", None)
        if shared is not None:
            with shared.begin_nested():
                yield shared
            return
        with self.engine.connect() as conn:
            if self._sqlite and write:
                conn.execution_options(sqlite_begin="IMMEDIATE")
            with conn.begin():
                yield conn

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Run the calls made inside (on this thread) in one transaction, committed at the end.

        Optional: every method is already atomic on its own. An audit cycle that writes 1,000
        jobs makes ~3,000 calls; on PostgreSQL each commit waits for a WAL flush, so grouping
        them saves seconds, and readers see the cycle's results all at once. Each call inside
        still runs in a savepoint: a call that fails undoes only itself. Nested batches join the
        outer one. On SQLite the batch holds the write lock until it ends.
        """
        if getattr(self._local, "conn", None) is not None:
            yield
            return
        with self._guard("commit a batch"), self.engine.connect() as conn:
            if self._sqlite:
                conn.execution_options(sqlite_begin="IMMEDIATE")
            with conn.begin():
                self._local.conn = conn
                try:
                    yield
                finally:
                    self._local.conn = None

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Turn database errors into StoreError naming the URL and the failed operation."""
        try:
            yield
        except Invalid as exc:
            raise StoreError(f"store {self.display_url}: {what} failed: {exc}") from exc
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(
                f"store {self.display_url}: {what} failed: {self._reason(exc)}",
                retryable=self._retryable(exc),
            ) from exc

    def _retryable(self, exc: sa.exc.SQLAlchemyError) -> bool:
        if isinstance(exc, (sa.exc.DisconnectionError, sa.exc.TimeoutError, sa.exc.InterfaceError)):
            return True
        if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
            return True
        if isinstance(exc, sa.exc.OperationalError):
            if not self._sqlite:
                return True
            if self._not_writable(exc):
                return False
            return bool(_SQLITE_TRANSIENT.search(str(exc.orig)))
        return False

    def _not_writable(self, exc: sa.exc.SQLAlchemyError) -> bool:
        """A SQLite write refused because this user may not write the file or its directory
        (a read-only file or mount): permanent, and said so."""
        if not self._sqlite or self.read_only or not _SQLITE_PERMISSION.search(str(getattr(exc, "orig", exc))):
            return False
        path = Path(self._url.database or "").expanduser()
        if not self._url.database or self._url.database == ":memory:":
            return False
        return not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK))

    def _reason(self, exc: sa.exc.SQLAlchemyError) -> str:
        """The driver's message without the SQL and parameters (long, and may hold data)."""
        orig = getattr(exc, "orig", None)
        text = str(orig) if orig is not None else str(exc).split("\n[SQL:", 1)[0]
        text = " ".join(line.strip() for line in text.strip().splitlines() if line.strip())
        for secret in self._secrets:
            text = text.replace(secret, "***")
        if self._not_writable(exc):
            text += " (the file or its directory is read-only to this user; commands that only read still work)"
        return text or type(exc).__name__


# ---------------------------------------------------------------------- engines


def _create_engine(url: URL, *, read_only: bool = False) -> Engine:
    if url.drivername.startswith("sqlite"):
        return _create_sqlite_engine(url, read_only=read_only)
    connect_args: dict[str, Any] = {}
    if "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = 10
    if read_only:  # the server refuses any write of this session, whatever the role may do
        connect_args["options"] = "-c default_transaction_read_only=on"
    return sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)


def _sqlite_read_only_uri(database: str) -> str:
    """The ``file:`` URI that opens ``database`` read-only. A WAL-mode file in a directory we
    cannot write (a read-only mount) cannot get its ``-shm`` index: there it is opened as
    ``immutable``, which is true of it while nobody can write that directory."""
    path = Path(database).expanduser().absolute()
    uri = f"file:{quote(str(path))}?mode=ro"
    if not os.access(path.parent, os.W_OK) and not path.with_name(path.name + "-shm").exists():
        uri += "&immutable=1"
    return uri


def _create_sqlite_engine(url: URL, *, read_only: bool = False) -> Engine:
    """SQLite with real transactions: the stdlib driver's implicit BEGIN does not cover DDL,
    so we switch it off and emit BEGIN ourselves (SQLAlchemy's documented recipe)."""
    database = url.database or ""
    memory = database in ("", ":memory:")
    if not memory and not read_only:
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    connect_args: dict[str, Any] = {"timeout": 30, "check_same_thread": False}
    kwargs: dict[str, Any] = {"connect_args": connect_args}
    if memory:
        kwargs["poolclass"] = sa.pool.StaticPool
    elif read_only:
        uri = _sqlite_read_only_uri(database)
        kwargs["creator"] = lambda: sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)
    engine = sa.create_engine(url, **kwargs)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        if not memory and not read_only:  # both write the file's header
            _set_wal(cur)
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("sqlite_begin")
        conn.exec_driver_sql(f"BEGIN {mode}" if mode else "BEGIN")

    return engine


def _set_wal(cur: Any, wait: float = 30.0) -> None:
    """``PRAGMA journal_mode=WAL``, waiting while another connection holds the lock.

    The pragma does not go through SQLite's busy timeout: while another process migrates a
    fresh file (migration 0004 rebuilds a table) it fails at once with "database is locked".
    """
    import sqlite3

    deadline = time.monotonic() + wait
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
