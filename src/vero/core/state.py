"""The sidecar's one durable, transactional state store: SQLite (docs/architecture.md, "State").

One database file (`/var/lib/vero/state.db`, mode 0600) holds the budget ledger, the evaluation
jobs, the candidate records and the submission. The standard library's `sqlite3` opens it in WAL
mode with `synchronous=FULL`: a transaction that returned is on disk, and a process killed at any
moment leaves the last committed state. Every state change is **one transaction**, so state that
must change together (a job's terminal state and its settle or refund; a reservation and the job
that owns it) does so or does not change at all.

Tables (DDL in `_SCHEMA`; `PRAGMA user_version` is `SCHEMA_VERSION`):

```
meta               key -> value (the store's identity: `format`, and the `session` id)
budgets            (partition, principal, resource) -> total, settled, reserved
reservations       id, partition, principal, state, created_at, closed_at, reason (creation order: seq)
reservation_costs  (reservation id, resource) -> amount, charged (what closing charges; NULL: as its state says),
                   overrun (metered above what it could charge: recorded, never charged)
budget_moves       seq -> reservation id, kind (reserve | close), budget, its reserved and settled after it
counts             'reservations' | 'jobs' -> how many were ever inserted
jobs               id, principal, partition, state, reservation_id (unique), record (the job's JSON)
candidates         id, parent, tree, subject, imported_at (import order: seq)
checked_trees      tree id -> its symlinks, files, bytes and directories (admission inspects only what changed from it)
submission         at most one row: candidate, version, submitted_at
```

Budgets are rows per *named resource* (`runs`, `cases`, ...), so a further dimension (tokens, cost)
is more rows, not a new schema. `settled` and `reserved` are maintained by triggers from the
reservations and their costs, and `CHECK (settled + reserved <= total)` makes an overspend fail
inside SQLite even if a caller's own check were wrong. The same triggers append each change of a
budget's figures to `budget_moves` with the figures after it (running totals, as a bank statement's
balance column), and count the reservations and jobs: in the same transaction as the rows.

Invariants, as constraints (checked on every write) and again when read, because a database edited
by hand may have been written with constraints and triggers off:

- figures are non-negative and settled + reserved + remaining = total per resource;
- each budget's settled and reserved figures equal the sums over its reservations in that state;
  its running totals agree: each move differs from the one before it by its reservation's cost
  (reserve: + amount reserved; close: - amount reserved, + what it charged), and the last one
  equals the budget's figures;
- a reservation is closed exactly when it has `closed_at`; a closed one never changes again;
- one reservation per job; a job is terminal exactly when its reservation is closed, and complete
  exactly when it was settled; a job record agrees with its row;
- no row is deleted (rows are numbered 1, 2, ... and `counts` says how many there are);
- the schema is exactly the one this module creates (no dropped trigger or constraint).

**Where they are checked.** `StateStore.open` checks, at a cost that does not grow with the
history: the identity and the schema, every budget against its running totals and against its
open reservations, and every row invariant of the newest `RECENT_ROWS` reservations, jobs, budget
moves and candidates and of every open reservation and unfinished job (about 10 ms, with 10,000 jobs
or none). `StateStore.verify` is the full check, of every row and SQLite's own integrity and
foreign-key checks (about 0.5 s of CPU per 10,000 jobs): it runs at seal
(`vero.core.session.write_session_archive`, before anything is packed) and on demand. So an edit
of a recent row or of a budget's figures is refused at open, before the first admission; an edit of
an older row alone (e.g. a refund of the 300th-last reservation turned into a settle) keeps the
figures consistent with their running totals, and is refused by the full check at seal.

A database that breaks any of them is refused (`LedgerCorrupt`): the sidecar never starts on (and
never seals) a tampered or half-understood state, and never resets it.

Concurrency: writes run one at a time in a worker thread on the writer connection
(`vero.core.offloop.GroupedCommits`), complete even if the awaiting caller is cancelled, and roll
back on any error. The changes that arrive while one commits are committed together as the next
transaction, each in its own savepoint (group commit, `StateStore._transactions`): under a burst
of admissions one durable write serves many, and each change still succeeds or fails alone. Reads
use one read-only connection per thread; `read` runs several queries in one snapshot. WAL lets
readers go on while a write is in flight: they see the last commit, never a half-applied one.

`export` renders the whole state as canonical JSON (sorted keys, creation order, fixed layout):
the same state gives the same bytes, which is what the sealed session archive carries.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from vero.core.job_states import TERMINAL_JOB_STATES
from vero.core.offloop import GroupedCommits, Outcome
from vero.errors import LedgerCorrupt, StorageFull

__all__ = [
    "EXPORT_VERSION",
    "RECENT_ROWS",
    "SCHEMA_VERSION",
    "STATE_FILE",
    "TERMINAL_JOB_STATES",
    "StateStore",
    "canonical_json",
    "iso",
]

SCHEMA_VERSION = 5
"""`PRAGMA user_version` of a state database this module writes and reads (3: `reservation_costs.overrun`;
4: the budget moves and row counts that make the open-time check independent of the history;
5: `checked_trees.directories`)."""

EXPORT_VERSION = 3
"""`schema_version` of `export` (the sealed `state.json`): its layout (3: the reservations' `overrun`),
unchanged by schemas 4 and 5."""

RECENT_ROWS = 256
"""How many of the newest reservations, jobs, budget moves and candidates the open-time check reads
row by row (besides every open reservation and unfinished job): the check's cost is bounded by
this, not by the history. Older rows are checked by `StateStore.verify` (at seal, or on demand)."""

STATE_FILE = "state.db"
"""The database's file name in the sidecar's state dir."""

_APPLICATION_ID = 0x7665726F  # "vero": marks the file as ours (`PRAGMA application_id`)


_DATETIME = TypeAdapter(datetime)

_TERMINAL_SQL = "('complete', 'failed', 'cancelled')"

_JOB_ID_GLOB = "ev-" + "[0-9a-f]" * 16
"""An evaluation id: `ev-` and 16 lowercase hex digits (the schema text is the same as when spelled out)."""

_SCHEMA = f"""
CREATE TABLE meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

CREATE TABLE budgets (
    partition TEXT NOT NULL,
    principal TEXT NOT NULL,
    resource TEXT NOT NULL,
    total INTEGER NOT NULL CHECK (total >= 0),
    settled INTEGER NOT NULL DEFAULT 0 CHECK (settled >= 0),
    reserved INTEGER NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    CHECK (settled + reserved <= total),
    PRIMARY KEY (partition, principal, resource)
) STRICT, WITHOUT ROWID;

CREATE TABLE reservations (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE CHECK (length(id) BETWEEN 1 AND 128),
    partition TEXT NOT NULL,
    principal TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('reserved', 'settled', 'refunded')),
    created_at TEXT NOT NULL,
    closed_at TEXT,
    reason TEXT,
    CHECK ((state = 'reserved') = (closed_at IS NULL))
) STRICT;

CREATE INDEX reservations_open ON reservations (seq) WHERE state = 'reserved';

CREATE TABLE reservation_costs (
    reservation_id TEXT NOT NULL REFERENCES reservations (id),
    partition TEXT NOT NULL,
    principal TEXT NOT NULL,
    resource TEXT NOT NULL,
    amount INTEGER NOT NULL CHECK (amount >= 0),
    charged INTEGER CHECK (charged IS NULL OR (charged >= 0 AND charged <= amount)),
    overrun INTEGER NOT NULL DEFAULT 0 CHECK (overrun >= 0),
    PRIMARY KEY (reservation_id, resource),
    FOREIGN KEY (partition, principal, resource) REFERENCES budgets (partition, principal, resource)
) STRICT, WITHOUT ROWID;

CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE CHECK (id GLOB '{_JOB_ID_GLOB}'),
    principal TEXT NOT NULL,
    partition TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'complete', 'failed', 'cancelled')),
    reservation_id TEXT NOT NULL UNIQUE REFERENCES reservations (id),
    record TEXT NOT NULL CHECK (json_valid(record)),
    CHECK (json_extract(record, '$.id') = id AND json_extract(record, '$.principal') = principal
           AND json_extract(record, '$.partition') = partition AND json_extract(record, '$.state') = state
           AND json_extract(record, '$.reservation_id') = reservation_id)
) STRICT;

CREATE INDEX jobs_by_principal ON jobs (principal, seq);
CREATE INDEX jobs_by_state ON jobs (principal, partition, state);
CREATE INDEX jobs_unfinished ON jobs (seq) WHERE state IN ('queued', 'running');
CREATE INDEX jobs_with_ladder ON jobs (seq) WHERE json_extract(record, '$.ladder') IS NOT NULL;
CREATE INDEX jobs_with_diagnostics ON jobs (seq) WHERE json_extract(record, '$.diagnostics') IS NOT NULL;

CREATE TABLE budget_moves (
    seq INTEGER PRIMARY KEY,
    reservation_id TEXT NOT NULL REFERENCES reservations (id),
    kind TEXT NOT NULL CHECK (kind IN ('reserve', 'close')),
    partition TEXT NOT NULL,
    principal TEXT NOT NULL,
    resource TEXT NOT NULL,
    reserved INTEGER NOT NULL CHECK (reserved >= 0),
    settled INTEGER NOT NULL CHECK (settled >= 0),
    UNIQUE (reservation_id, resource, kind),
    FOREIGN KEY (partition, principal, resource) REFERENCES budgets (partition, principal, resource)
) STRICT;

CREATE INDEX budget_moves_by_budget ON budget_moves (partition, principal, resource, seq);

CREATE TABLE counts (
    name TEXT PRIMARY KEY CHECK (name IN ('reservations', 'jobs')),
    value INTEGER NOT NULL CHECK (value >= 0)
) STRICT, WITHOUT ROWID;

CREATE TABLE candidates (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE CHECK (length(id) = 40 AND id NOT GLOB '*[^0-9a-f]*'),
    parent TEXT,
    tree TEXT NOT NULL,
    subject TEXT NOT NULL,
    imported_at TEXT NOT NULL
) STRICT;

CREATE TABLE checked_trees (
    tree TEXT PRIMARY KEY,
    symlinks TEXT NOT NULL CHECK (json_valid(symlinks)),
    files INTEGER NOT NULL CHECK (files >= 0),
    bytes INTEGER NOT NULL CHECK (bytes >= 0),
    directories INTEGER NOT NULL CHECK (directories >= 0)
) STRICT, WITHOUT ROWID;

CREATE TABLE submission (
    slot INTEGER PRIMARY KEY CHECK (slot = 1),
    candidate TEXT NOT NULL REFERENCES candidates (id),
    version TEXT NOT NULL,
    submitted_at TEXT NOT NULL
) STRICT;

CREATE TRIGGER reservation_opens BEFORE INSERT ON reservations
WHEN NEW.state != 'reserved'
BEGIN SELECT RAISE(ABORT, 'a reservation starts reserved'); END;

CREATE TRIGGER reservation_cost_charged AFTER INSERT ON reservation_costs
BEGIN
    SELECT RAISE(ABORT, 'a cost belongs to an open reservation of the same budget')
    WHERE NOT EXISTS (SELECT 1 FROM reservations r WHERE r.id = NEW.reservation_id AND r.state = 'reserved'
                      AND r.partition = NEW.partition AND r.principal = NEW.principal);
    UPDATE budgets SET reserved = reserved + NEW.amount
    WHERE partition = NEW.partition AND principal = NEW.principal AND resource = NEW.resource;
    INSERT INTO budget_moves (reservation_id, kind, partition, principal, resource, reserved, settled)
    SELECT NEW.reservation_id, 'reserve', b.partition, b.principal, b.resource, b.reserved, b.settled FROM budgets b
    WHERE b.partition = NEW.partition AND b.principal = NEW.principal AND b.resource = NEW.resource;
END;

CREATE TRIGGER reservation_cost_fixed BEFORE UPDATE ON reservation_costs
WHEN NEW.reservation_id IS NOT OLD.reservation_id OR NEW.partition IS NOT OLD.partition
  OR NEW.principal IS NOT OLD.principal OR NEW.resource IS NOT OLD.resource OR NEW.amount IS NOT OLD.amount
  OR NOT EXISTS (SELECT 1 FROM reservations r WHERE r.id = OLD.reservation_id AND r.state = 'reserved')
BEGIN SELECT RAISE(ABORT, 'a reservation cost never changes; what it charges is set while it is open'); END;

CREATE TRIGGER reservation_cost_kept BEFORE DELETE ON reservation_costs
BEGIN SELECT RAISE(ABORT, 'a reservation cost is never deleted'); END;

CREATE TRIGGER reservation_kept BEFORE DELETE ON reservations
BEGIN SELECT RAISE(ABORT, 'a reservation is never deleted'); END;

CREATE TRIGGER reservation_identity_fixed BEFORE UPDATE OF id, partition, principal, created_at ON reservations
BEGIN SELECT RAISE(ABORT, 'a reservation''s identity never changes'); END;

CREATE TRIGGER reservation_closes BEFORE UPDATE OF state ON reservations
BEGIN
    SELECT RAISE(ABORT, 'a closed reservation never changes') WHERE OLD.state != 'reserved';
    SELECT RAISE(ABORT, 'a reservation closes as settled or refunded') WHERE NEW.state = 'reserved';
    SELECT RAISE(ABORT, 'the reservation belongs to a job that has not finished')
    WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.reservation_id = NEW.id AND j.state NOT IN {_TERMINAL_SQL});
END;

CREATE TRIGGER reservation_closed AFTER UPDATE OF state ON reservations
BEGIN
    UPDATE budgets SET
        reserved = reserved - (SELECT c.amount FROM reservation_costs c
                               WHERE c.reservation_id = NEW.id AND c.resource = budgets.resource),
        settled = settled + (SELECT coalesce(c.charged, CASE WHEN NEW.state = 'settled' THEN c.amount ELSE 0 END)
                             FROM reservation_costs c
                             WHERE c.reservation_id = NEW.id AND c.resource = budgets.resource)
    WHERE partition = NEW.partition AND principal = NEW.principal
      AND resource IN (SELECT c.resource FROM reservation_costs c WHERE c.reservation_id = NEW.id);
    INSERT INTO budget_moves (reservation_id, kind, partition, principal, resource, reserved, settled)
    SELECT NEW.id, 'close', b.partition, b.principal, b.resource, b.reserved, b.settled
    FROM budgets b JOIN reservation_costs c ON c.reservation_id = NEW.id AND c.resource = b.resource
    WHERE b.partition = NEW.partition AND b.principal = NEW.principal ORDER BY b.resource;
END;

CREATE TRIGGER reservation_counted AFTER INSERT ON reservations
BEGIN UPDATE counts SET value = value + 1 WHERE name = 'reservations'; END;

CREATE TRIGGER job_counted AFTER INSERT ON jobs
BEGIN UPDATE counts SET value = value + 1 WHERE name = 'jobs'; END;

CREATE TRIGGER budget_move_kept BEFORE DELETE ON budget_moves
BEGIN SELECT RAISE(ABORT, 'a budget move is never deleted'); END;

CREATE TRIGGER budget_move_fixed BEFORE UPDATE ON budget_moves
BEGIN SELECT RAISE(ABORT, 'a budget move never changes'); END;

CREATE TRIGGER count_kept BEFORE DELETE ON counts
BEGIN SELECT RAISE(ABORT, 'a row count is never deleted'); END;

CREATE TRIGGER budget_kept BEFORE DELETE ON budgets
BEGIN SELECT RAISE(ABORT, 'a budget is never deleted'); END;

CREATE TRIGGER job_kept BEFORE DELETE ON jobs
BEGIN SELECT RAISE(ABORT, 'a job is never deleted'); END;

CREATE TRIGGER job_identity_fixed BEFORE UPDATE OF id, principal, partition, reservation_id ON jobs
BEGIN SELECT RAISE(ABORT, 'a job''s identity never changes'); END;

CREATE TRIGGER job_terminal_is_final BEFORE UPDATE OF state ON jobs
WHEN OLD.state IN {_TERMINAL_SQL} AND NEW.state != OLD.state
BEGIN SELECT RAISE(ABORT, 'a finished job never changes state'); END;

CREATE TRIGGER job_opens_with_its_reservation BEFORE INSERT ON jobs
BEGIN
    SELECT RAISE(ABORT, 'a job starts unfinished, with an open reservation of its own budget')
    WHERE NEW.state IN {_TERMINAL_SQL}
       OR NOT EXISTS (SELECT 1 FROM reservations r WHERE r.id = NEW.reservation_id AND r.state = 'reserved'
                      AND r.partition = NEW.partition AND r.principal = NEW.principal);
END;

CREATE TRIGGER candidate_kept BEFORE DELETE ON candidates
BEGIN SELECT RAISE(ABORT, 'a candidate record is never deleted'); END;

CREATE TRIGGER candidate_fixed BEFORE UPDATE ON candidates
BEGIN SELECT RAISE(ABORT, 'a candidate record never changes'); END;
"""


def iso(moment: datetime) -> str:
    """A datetime as the state store keeps it: pydantic's JSON form (`2026-11-30T12:00:00.5Z` for UTC)."""
    return _DATETIME.dump_python(moment, mode="json")


def canonical_json(value: Any) -> bytes:
    """`value` as canonical JSON bytes: sorted keys, two-space indent, UTF-8, trailing newline."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).encode() + b"\n"


def _expected_schema() -> set[tuple[str, str, str, str]]:
    probe = sqlite3.connect(":memory:")
    try:
        probe.executescript(_SCHEMA)
        return _schema_of(probe)
    finally:
        probe.close()


def _schema_of(conn: sqlite3.Connection) -> set[tuple[str, str, str, str]]:
    rows = conn.execute(
        "SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return {tuple(row) for row in rows}


class StateStore:
    """The state database. Create with `StateStore.open`; share one per process.

    Attributes:
        path: the database file.
    """

    path: Path
    generation: int
    """How many transactions this store has committed since it was opened: a reader that saw the
    same generation before and after a read knows nothing changed (`SidecarService.status_body`)."""

    def __init__(self, path: Path, writer: sqlite3.Connection) -> None:
        """Use `StateStore.open`."""
        self.path = path
        self._writer = writer
        self._commits: GroupedCommits[Callable[[sqlite3.Connection], Any]] = GroupedCommits(self._transactions)
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._session_id: str | None = None
        self.generation = 0

    # -- opening ------------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path) -> StateStore:
        """Open the database at `path`, creating it (mode 0600, with its directory) when missing.

        Synchronous: call it at startup, or through `asyncio.to_thread` from a running loop.

        Raises:
            LedgerCorrupt: the file exists but is not a vero state database of `SCHEMA_VERSION`, its
                schema differs, or its content breaks an invariant (see the module docstring). The
                message names the file and the problem, never the content; the file is untouched.
            OSError: the file or its directory cannot be created.
        """
        path = Path(os.path.abspath(path))
        fresh = not (path.exists() or path.is_symlink())
        if fresh:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Created here with its final mode: SQLite gives the -wal and -shm files the same.
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600))
        elif path.is_symlink() or not path.is_file():
            raise LedgerCorrupt(f"state database {path} is not a regular file; refusing to start rather than reset it")
        try:
            writer = _connect(path, read_only=False)
        except sqlite3.Error as exc:
            raise LedgerCorrupt(
                f"state database {path} cannot be opened ({_sqlite_reason(exc)}); "
                f"refusing to start rather than reset it"
            ) from None
        try:
            if fresh or _is_empty(writer):
                writer.execute("BEGIN IMMEDIATE")
                for statement in _split_statements(_SCHEMA):
                    writer.execute(statement)
                writer.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
                writer.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                writer.execute("INSERT INTO meta (key, value) VALUES ('format', 'vero-state')")
                writer.execute("INSERT INTO meta (key, value) VALUES ('session', ?)", (_new_session(),))
                writer.execute("INSERT INTO counts (name, value) VALUES ('reservations', 0), ('jobs', 0)")
                writer.execute("COMMIT")
            _verify_identity(writer, path)
            _verify_rows(writer, path, RECENT_ROWS)
            if writer.execute("SELECT 1 FROM meta WHERE key = 'session'").fetchone() is None:
                # A store written before sessions were recorded gets its own, once.
                try:
                    writer.execute("INSERT INTO meta (key, value) VALUES ('session', ?)", (_new_session(),))
                except sqlite3.OperationalError as exc:
                    if _sqlite_reason(exc) == "SQLITE_FULL":
                        raise StorageFull(f"state database {path}: the file system is full") from None
                    raise
        except (LedgerCorrupt, StorageFull):
            writer.close()
            raise
        except sqlite3.Error as exc:
            writer.close()
            raise LedgerCorrupt(
                f"state database {path} cannot be read ({_sqlite_reason(exc)}); refusing to start rather than reset it"
            ) from None
        return cls(path, writer)

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection (the writer's last commit is already durable). Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._readers_lock:
            readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
        self._writer.close()

    # -- writing ------------------------------------------------------------------------------------

    async def commit[T](self, change: Callable[[sqlite3.Connection], T]) -> T:
        """Run `change` as one transaction, off the event loop, after every earlier commit.

        `change` gets the writer connection inside `BEGIN IMMEDIATE`; it may run any statements and
        raise to roll everything back. The transaction completes (commit or rollback) even if the
        awaiting caller is cancelled meanwhile; the cancellation is raised afterwards.

        Returns:
            What `change` returned, once the transaction is durable.

        Raises:
            Exception: whatever `change` raised (nothing was written).
            StorageFull: the file system is full (`SQLITE_FULL`); nothing was written.
            OSError: SQLite failed to write otherwise (I/O error); nothing was written.
        """
        return await self._commits.run(change)

    def commit_sync[T](self, change: Callable[[sqlite3.Connection], T]) -> T:
        """Blocking `commit` (for startup and tools; never call it on a running event loop)."""
        return self._commits.run_sync(lambda: self._transaction(change))

    def _transaction[T](self, change: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._writer
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._write_error("cannot begin a write", exc) from None
        try:
            value = change(conn)
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError):
                raise self._write_error("write failed", exc) from None
            raise
        finally:
            # Also after a failed COMMIT or ROLLBACK: a generation that moves without a change only
            # costs a reader a fresh read.
            self.generation += 1
        return value

    def _transactions(self, changes: list[Callable[[sqlite3.Connection], Any]]) -> list[Outcome]:
        """The changes `commit` queued while the previous ones ran: one transaction for all (group
        commit: one durable write instead of one each), else one each.

        Each change runs in its own savepoint, so one that raises undoes only its own statements and
        gets its exception; the rest commit together, and none is answered before that commit is
        durable. If SQLite itself fails (a change's statement, or the commit: a full disk, an I/O
        error), the group is rolled back and each change runs again alone, as `_transaction` runs
        it, so each gets exactly the outcome it would have had by itself.
        """
        if len(changes) > 1:
            try:
                return self._group_transaction(changes)
            except _GroupFailed:
                pass
        return [_outcome(self._transaction, change) for change in changes]

    def _group_transaction(self, changes: list[Callable[[sqlite3.Connection], Any]]) -> list[Outcome]:
        conn = self._writer
        outcomes: list[Outcome] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for change in changes:
                conn.execute("SAVEPOINT vero_change")
                try:
                    outcomes.append((True, change(conn)))
                except sqlite3.Error:
                    raise
                except Exception as exc:  # noqa: BLE001 - the change's refusal, its caller's: undo its statements only
                    conn.execute("ROLLBACK TO vero_change")
                    outcomes.append((False, exc))
                conn.execute("RELEASE vero_change")
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise _GroupFailed from None
            raise
        finally:
            self.generation += 1
        return outcomes

    def _write_error(self, what: str, exc: sqlite3.Error) -> OSError:
        reason = _sqlite_reason(exc)
        if reason == "SQLITE_FULL":
            return StorageFull(f"state database {self.path}: the file system is full; nothing was written")
        return OSError(f"state database {self.path}: {what} ({reason})")

    @property
    def session_id(self) -> str:
        """This state's session: `ses-<16 hex>`, written when the store was first opened and never
        changed (nested runs label their environments with it: `vero.harbor.leftovers`): read once."""
        if self._session_id is None:
            self._session_id = self.rows("SELECT value FROM meta WHERE key = 'session'")[0][0]
        return self._session_id

    def verify(self) -> None:
        """The full check of every invariant of the module docstring over the whole history, in one
        read snapshot (`open` checks the newest `RECENT_ROWS` rows of each table, every open
        reservation and unfinished job, and the budgets against their running totals; an older row
        edited by hand is found here). Runs at seal (`vero.core.session.write_session_archive`) and
        on demand; reads every row (about 0.1 s of CPU per 10,000 jobs). Thread-safe.

        Raises:
            LedgerCorrupt: names the first invariant that does not hold (nothing is changed).
        """
        try:
            self.read(lambda conn: _verify_all(conn, self.path))
        except sqlite3.DatabaseError as exc:
            raise _refuse(self.path, f"cannot be read ({_sqlite_reason(exc)})", _AT_CHECK) from None

    # -- reading ------------------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise RuntimeError("the state store is closed")
            conn = _connect(self.path, read_only=True)
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def read[T](self, query: Callable[[sqlite3.Connection], T]) -> T:
        """Run `query` in one read snapshot (every statement sees the same committed state).

        Reads nested in `query` (on the same thread) share its snapshot. Cheap enough for the event
        loop when the queries are point lookups or index ranges.
        """
        conn = self._reader()
        if conn.in_transaction:  # nested in an enclosing `read` of this thread: same snapshot
            return query(conn)
        conn.execute("BEGIN")
        try:
            return query(conn)
        finally:
            conn.execute("COMMIT")

    def rows(self, sql: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One query's rows, in its own snapshot (or the enclosing `read`'s)."""
        return self._reader().execute(sql, parameters).fetchall()

    # -- export -------------------------------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """The whole state as plain JSON data, in one snapshot (see `export_bytes`)."""
        return self.read(_export)

    def export_bytes(self) -> bytes:
        """`canonical_json(export())`: the same state gives the same bytes."""
        return canonical_json(self.export())


def _export(conn: sqlite3.Connection) -> dict[str, Any]:
    budgets = [
        {"partition": p, "principal": q, "resource": r, "total": t, "settled": s, "reserved": v}
        for p, q, r, t, s, v in conn.execute(
            "SELECT partition, principal, resource, total, settled, reserved FROM budgets "
            "ORDER BY partition, principal, resource"
        )
    ]
    costs: dict[str, dict[str, int]] = {}
    charged: dict[str, dict[str, int]] = {}
    overrun: dict[str, dict[str, int]] = {}
    for rid, resource, amount, charge, over in conn.execute(
        "SELECT reservation_id, resource, amount, charged, overrun FROM reservation_costs"
    ):
        costs.setdefault(rid, {})[resource] = amount
        if charge is not None:
            charged.setdefault(rid, {})[resource] = charge
        if over:
            overrun.setdefault(rid, {})[resource] = over
    reservations = [
        {
            "id": rid,
            "partition": p,
            "principal": q,
            "state": state,
            "cost": costs.get(rid, {}),
            "charged": charged.get(rid, {}),
            "overrun": overrun.get(rid, {}),
            "created_at": created,
            "closed_at": closed,
            "reason": reason,
        }
        for rid, p, q, state, created, closed, reason in conn.execute(
            "SELECT id, partition, principal, state, created_at, closed_at, reason FROM reservations ORDER BY seq"
        )
    ]
    jobs = [json.loads(record) for (record,) in conn.execute("SELECT record FROM jobs ORDER BY seq")]
    candidates = [
        {"id": cid, "parent": parent, "tree": tree, "subject": subject, "imported_at": imported}
        for cid, parent, tree, subject, imported in conn.execute(
            "SELECT id, parent, tree, subject, imported_at FROM candidates ORDER BY seq"
        )
    ]
    row = conn.execute("SELECT candidate, version, submitted_at FROM submission").fetchone()
    submission = None if row is None else {"candidate": row[0], "version": row[1], "submitted_at": row[2]}
    return {
        "schema_version": EXPORT_VERSION,
        "budgets": budgets,
        "reservations": reservations,
        "jobs": jobs,
        "candidates": candidates,
        "submission": submission,
    }


def _new_session() -> str:
    return f"ses-{secrets.token_hex(8)}"


def _connect(path: Path, *, read_only: bool) -> sqlite3.Connection:
    if read_only:
        conn = sqlite3.connect(
            f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None, check_same_thread=False, timeout=30.0
        )
    else:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
        # WAL: readers never block the writer; FULL: every commit is fsynced before it returns.
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            conn.close()
            raise sqlite3.OperationalError("the database cannot use write-ahead logging")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")
    if read_only:
        conn.execute("PRAGMA query_only = ON")
    return conn


def _is_empty(conn: sqlite3.Connection) -> bool:
    return (
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0] == 0
        and conn.execute("PRAGMA user_version").fetchone()[0] == 0
    )


def _split_statements(script: str) -> Iterator[str]:
    """The statements of `script`, trigger bodies kept whole (`sqlite3.complete_statement`)."""
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            statement = buffer.strip()
            buffer = ""
            if statement:
                yield statement
    if buffer.strip():
        raise ValueError("incomplete statement at the end of the schema")


class _GroupFailed(Exception):
    """SQLite failed during a group transaction (rolled back): run its changes one by one (internal)."""


def _outcome(run: Callable[[Callable[[sqlite3.Connection], Any]], Any], change: Callable[..., Any]) -> Outcome:
    try:
        return True, run(change)
    except Exception as exc:  # noqa: BLE001 - raised to the change's caller (`GroupedCommits.run`)
        return False, exc


def _sqlite_reason(exc: sqlite3.Error) -> str:
    # The error name only: SQLite messages can quote row content.
    return getattr(exc, "sqlite_errorname", None) or type(exc).__name__


_AT_OPEN = "refusing to start rather than reset it"
_AT_CHECK = "(found by the full check; nothing was changed)"


def _refuse(path: Path, problem: str, consequence: str = _AT_OPEN) -> LedgerCorrupt:
    return LedgerCorrupt(f"state database {path} {problem}; {consequence}")


def _verify_identity(conn: sqlite3.Connection, path: Path, consequence: str = _AT_OPEN) -> None:
    """The file is a vero state database of this version, its schema exactly `_SCHEMA` (no dropped
    trigger or constraint), its identity records well formed. Independent of the history.

    Raises:
        LedgerCorrupt: names what differs.
    """
    if conn.execute("PRAGMA application_id").fetchone()[0] != _APPLICATION_ID:
        raise _refuse(path, "is not a vero state database", consequence)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version != SCHEMA_VERSION:
        raise _refuse(path, f"has schema version {version}, this vero reads {SCHEMA_VERSION}", consequence)
    if _schema_of(conn) != _EXPECTED_SCHEMA:
        raise _refuse(
            path, "has a schema that differs from vero's (a table, index or trigger was changed)", consequence
        )
    if (
        conn.execute(
            """SELECT 1 FROM meta WHERE NOT ((key = 'format' AND value = 'vero-state')
          OR (key = 'session' AND length(value) = 20 AND value GLOB 'ses-[0-9a-f]*'
              AND substr(value, 5) NOT GLOB '*[^0-9a-f]*')) LIMIT 1"""
        ).fetchone()
        is not None
    ):
        raise _refuse(path, "has an unknown or malformed identity record", consequence)


def _floor(conn: sqlite3.Connection, table: str, recent: int | None) -> tuple[int, int]:
    """`(newest seq, floor)` of `table`: its rows above the floor are the `recent` newest (all: None)."""
    newest = conn.execute(f"SELECT coalesce(max(seq), 0) FROM {table}").fetchone()[0]
    return newest, 0 if recent is None else max(newest - recent, 0)


# What a closed reservation's cost row charged its budget (`charged` where set, else as its state says).
_EFFECTIVE_CHARGE = "coalesce(c.charged, CASE WHEN r.state = 'settled' THEN c.amount ELSE 0 END)"

# The budget's figures just before move `m` (its previous move's; none: 0).
_BEFORE_MOVE = """coalesce((SELECT p.{figure} FROM budget_moves p WHERE p.partition = m.partition
    AND p.principal = m.principal AND p.resource = m.resource AND p.seq < m.seq ORDER BY p.seq DESC LIMIT 1), 0)"""

# The budget's figures after its last move (none: 0).
_LAST_MOVE = """coalesce((SELECT m.{figure} FROM budget_moves m WHERE m.partition = b.partition
    AND m.principal = b.principal AND m.resource = b.resource ORDER BY m.seq DESC LIMIT 1), 0)"""

_RECENT_RESERVATIONS = """(SELECT * FROM reservations WHERE seq > :reservations
    UNION ALL SELECT * FROM reservations WHERE state = 'reserved' AND seq <= :reservations)"""

_RECENT_JOBS = """(SELECT * FROM jobs WHERE seq > :jobs
    UNION ALL SELECT * FROM jobs WHERE state IN ('queued', 'running') AND seq <= :jobs)"""

_JOB_AGREES = f"""(j.state IN {_TERMINAL_SQL}) = (r.state != 'reserved')
    AND (j.state = 'complete') = (r.state = 'settled') AND j.partition = r.partition AND j.principal = r.principal"""

_ROW_CHECKS = (
    (
        "a budget's figures are negative or exceed its total",
        """SELECT 1 FROM budgets WHERE NOT (total >= 0 AND settled >= 0 AND reserved >= 0
            AND settled + reserved <= total) LIMIT 1""",
    ),
    (
        "a budget's figures differ from its last move (the running totals)",
        f"""SELECT 1 FROM budgets b WHERE b.reserved != {_LAST_MOVE.format(figure="reserved")}
            OR b.settled != {_LAST_MOVE.format(figure="settled")} LIMIT 1""",
    ),
    (
        "a budget's reserved figure differs from the costs of its open reservations",
        """SELECT 1 FROM budgets b WHERE b.reserved != (SELECT coalesce(sum(c.amount), 0) FROM reservations r
            JOIN reservation_costs c ON c.reservation_id = r.id WHERE r.state = 'reserved'
            AND c.partition = b.partition AND c.principal = b.principal AND c.resource = b.resource) LIMIT 1""",
    ),
    (
        "a budget move differs from its reservation's cost (or the running totals skip)",
        f"""SELECT 1 FROM budget_moves m LEFT JOIN reservations r ON r.id = m.reservation_id
            LEFT JOIN reservation_costs c ON c.reservation_id = m.reservation_id AND c.resource = m.resource
            WHERE m.seq > :moves AND (r.id IS NULL OR c.reservation_id IS NULL
              OR m.kind NOT IN ('reserve', 'close') OR (m.kind = 'close' AND r.state = 'reserved')
              OR m.partition != r.partition OR m.principal != r.principal
              OR m.reserved != {_BEFORE_MOVE.format(figure="reserved")}
                               + CASE m.kind WHEN 'reserve' THEN c.amount ELSE -c.amount END
              OR m.settled != {_BEFORE_MOVE.format(figure="settled")}
                              + CASE m.kind WHEN 'reserve' THEN 0 ELSE {_EFFECTIVE_CHARGE} END) LIMIT 1""",
    ),
    (
        "has a malformed reservation (state, closing time or id)",
        f"""SELECT 1 FROM {_RECENT_RESERVATIONS} r WHERE r.state NOT IN ('reserved', 'settled', 'refunded')
            OR (r.state = 'reserved') != (r.closed_at IS NULL) OR length(r.id) NOT BETWEEN 1 AND 128 LIMIT 1""",
    ),
    (
        "a reservation cost is malformed, charged to another budget, or missing its moves",
        f"""SELECT 1 FROM {_RECENT_RESERVATIONS} r JOIN reservation_costs c ON c.reservation_id = r.id
            WHERE c.amount < 0 OR c.overrun < 0 OR (c.charged IS NOT NULL AND (c.charged < 0 OR c.charged > c.amount))
              OR c.partition != r.partition OR c.principal != r.principal
              OR NOT EXISTS (SELECT 1 FROM budgets b WHERE b.partition = c.partition
                             AND b.principal = c.principal AND b.resource = c.resource)
              OR NOT EXISTS (SELECT 1 FROM budget_moves m WHERE m.reservation_id = c.reservation_id
                             AND m.resource = c.resource AND m.kind = 'reserve')
              OR (r.state != 'reserved') != EXISTS (SELECT 1 FROM budget_moves m
                             WHERE m.reservation_id = c.reservation_id AND m.resource = c.resource
                             AND m.kind = 'close') LIMIT 1""",
    ),
    (
        "has a malformed job row (id, state or record)",
        f"""SELECT 1 FROM {_RECENT_JOBS} j WHERE j.id NOT GLOB '{_JOB_ID_GLOB}'
            OR j.state NOT IN ('queued', 'running', 'complete', 'failed', 'cancelled') OR NOT json_valid(j.record)
            LIMIT 1""",
    ),
    (
        "has a job record whose id, state or owner differs from its row",
        f"""SELECT 1 FROM {_RECENT_JOBS} j WHERE json_extract(j.record, '$.id') IS NOT j.id
            OR json_extract(j.record, '$.state') IS NOT j.state
            OR json_extract(j.record, '$.principal') IS NOT j.principal
            OR json_extract(j.record, '$.partition') IS NOT j.partition
            OR json_extract(j.record, '$.reservation_id') IS NOT j.reservation_id LIMIT 1""",
    ),
    (
        "a finished job's reservation is still open, an unfinished job's is closed, or it is missing",
        f"""SELECT 1 FROM {_RECENT_JOBS} j LEFT JOIN reservations r ON r.id = j.reservation_id
            WHERE r.id IS NULL OR NOT ({_JOB_AGREES}) LIMIT 1""",
    ),
    (
        "a reservation's job disagrees with it (finished while it is open, or unfinished while it is closed)",
        f"""SELECT 1 FROM {_RECENT_RESERVATIONS} r JOIN jobs j ON j.reservation_id = r.id
            WHERE NOT ({_JOB_AGREES}) LIMIT 1""",
    ),
    (
        "has a malformed candidate record or a submission of an unknown candidate",
        """SELECT 1 FROM candidates WHERE seq > :candidates AND (length(id) != 40 OR id GLOB '*[^0-9a-f]*')
            UNION ALL SELECT 1 FROM submission s WHERE s.slot != 1
              OR NOT EXISTS (SELECT 1 FROM candidates c WHERE c.id = s.candidate) LIMIT 1""",
    ),
)
"""The row checks: of the `recent` newest rows (and every open reservation and unfinished job) at
open, of every row in the full check. Each query selects a row that breaks the invariant named."""


def _verify_rows(conn: sqlite3.Connection, path: Path, recent: int | None, consequence: str = _AT_OPEN) -> None:
    """The row invariants (`_ROW_CHECKS`) of the `recent` newest rows of each table, every open
    reservation and unfinished job (None: of every row), the budgets against their running totals
    (their last move, each move against the one before it), and no row missing among them (rows
    are numbered 1, 2, ... and never deleted: `counts` holds how many reservations and jobs exist).
    Reads O(`recent` + open reservations + unfinished jobs + budgets) rows (each with an index lookup).

    Raises:
        LedgerCorrupt: names the first invariant that does not hold.
    """
    floors: dict[str, int] = {}
    for table in ("reservations", "jobs", "budget_moves", "candidates"):
        newest, floor = _floor(conn, table, recent)
        above = conn.execute(f"SELECT count(*) FROM {table} WHERE seq > ?", (floor,)).fetchone()[0]
        if above != newest - floor:
            raise _refuse(path, f"is missing rows of {table} (a record was deleted)", consequence)
        if table in ("reservations", "jobs"):
            row = conn.execute("SELECT value FROM counts WHERE name = ?", (table,)).fetchone()
            if row is None or row[0] != newest:
                raise _refuse(
                    path, f"holds another number of {table} than it counted (a record was deleted)", consequence
                )
        floors[table.removeprefix("budget_")] = floor
    for problem, sql in _ROW_CHECKS:
        if conn.execute(sql, floors).fetchone() is not None:
            raise _refuse(path, problem if problem.startswith("has") else f"is inconsistent: {problem}", consequence)


def _verify_all(conn: sqlite3.Connection, path: Path) -> None:
    """The full check: `_verify_identity`, SQLite's own integrity and foreign-key checks, every row
    (`_verify_rows` of the whole history) and each budget's figures against the sums over all its
    reservations. Reads every row: at seal (`vero.core.session.write_session_archive`) and on demand.

    Raises:
        LedgerCorrupt: names the first invariant that does not hold.
    """
    _verify_identity(conn, path, _AT_CHECK)
    # quick_check verifies NOT NULL and CHECK constraints of every row and the b-tree structure.
    problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
    if problems != ["ok"]:
        raise _refuse(
            path, "fails SQLite's integrity check (a row breaks a constraint or a page is damaged)", _AT_CHECK
        )
    if conn.execute("PRAGMA foreign_key_check").fetchone() is not None:
        raise _refuse(path, "has a record that refers to a missing one (reservation, budget or candidate)", _AT_CHECK)
    for table in ("reservations", "jobs"):
        if conn.execute(
            f"SELECT 1 FROM counts WHERE name = ? AND value != (SELECT count(*) FROM {table})", (table,)
        ).fetchone():
            raise _refuse(path, f"holds another number of {table} than it counted (a record was deleted)", _AT_CHECK)
    if conn.execute(
        f"""SELECT 1 FROM budgets b WHERE
          b.settled != (SELECT coalesce(sum({_EFFECTIVE_CHARGE}), 0)
                        FROM reservation_costs c JOIN reservations r
                        ON r.id = c.reservation_id WHERE r.state != 'reserved' AND c.partition = b.partition
                        AND c.principal = b.principal AND c.resource = b.resource)
       OR b.reserved != (SELECT coalesce(sum(c.amount), 0) FROM reservation_costs c JOIN reservations r
                         ON r.id = c.reservation_id WHERE r.state = 'reserved' AND c.partition = b.partition
                         AND c.principal = b.principal AND c.resource = b.resource)
       LIMIT 1"""
    ).fetchone():
        raise _refuse(
            path,
            "is inconsistent: a budget's settled or reserved figure differs from the sum of its reservations",
            _AT_CHECK,
        )
    if conn.execute(
        """SELECT 1 FROM reservation_costs c LEFT JOIN reservations r ON r.id = c.reservation_id
        WHERE r.id IS NULL OR r.partition != c.partition OR r.principal != c.principal LIMIT 1"""
    ).fetchone():
        raise _refuse(path, "has a reservation cost charged to another budget than its reservation's", _AT_CHECK)
    _verify_rows(conn, path, None, _AT_CHECK)


_EXPECTED_SCHEMA = _expected_schema()
