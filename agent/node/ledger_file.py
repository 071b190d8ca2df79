"""The node's ledger on disk, so a restarted agent keeps its occupancy (``ledger.sqlite3`` in the state directory).

An agent that was killed comes back while the blocks it wrote are still in the Store (in another node's segment,
or in its node's ``mooncake_client`` segment); an empty ledger would report none of them. So the agent keeps the
blocks it owns in a file: a ledger listener (:meth:`agent.datapath.ledger.Ledger.add_listener`) notes every
``insert`` and ``remove`` of an owned block in memory (a dict assignment under the ledger's lock; ``access`` is
ignored), and a background thread writes what changed every ``flush_interval`` seconds in **one SQLite
transaction**. At start (:func:`open_ledger_file`, before the daemon reports anything) the file's blocks go back into
the ledger (:meth:`agent.datapath.ledger.Ledger.restore`); the reconcile with the Store then drops those that left
it while the agent was down (the simulator's every 2 s and ``agent.node.engines.NodeEngines``' first tick: a sample,
escalating to every block once the sample finds one gone).

Crash safety: SQLite in WAL mode with ``synchronous=NORMAL``: a killed process loses at most the changes of the
last ``flush_interval`` (blocks stored then are missing from the restored ledger; blocks removed then are dropped by
the first reconcile), never the file's consistency. A file that cannot be opened or read (corrupt, another format,
a newer schema) is logged and moved aside (``ledger.sqlite3.bad-<unix time>``) and the agent starts with an empty
ledger: it never refuses to start over it (nor over a state directory where no file can be made: it then runs
without one, logged).

File format (schema 1; ``meta`` holds ``format`` = ``kvpool-ledger`` and ``schema`` = ``1``):

* ``keyspaces(id INTEGER PRIMARY KEY, spec TEXT UNIQUE)`` — a key space's constructor fields as a JSON object
  (``agent.datapath.keyspace.KeySpace``, which gives the block's scope and object keys; built and validated
  again at load, a key space that no longer validates is skipped with its blocks);
* ``blocks(keyspace INTEGER, block_hash BLOB, parent BLOB NULL, size INTEGER, PRIMARY KEY (keyspace,
  block_hash)) WITHOUT ROWID`` — one row per block the node owns and believes present: its raw hash, its
  parent's raw hash (same key space; NULL for a chain's first block, or a parent the ledger no longer knew) and
  bytes of all its objects.

Not kept: hit counts, last access (restored blocks start now), the cumulative counters (the report's
``started_at`` tells the dashboard they restarted), foreign parents (an owned block below a foreign parent is a
root after a restart, so its orphan state is known again only once that parent is seen).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from agent.datapath.keyspace import KeySpace
from agent.datapath.ledger import BlockEntry, Ledger, RestoredBlock, ScopeTable

log = logging.getLogger("kvpool.agent.ledger_file")

#: File name in the state directory.
LEDGER_FILE = "ledger.sqlite3"
FORMAT = "kvpool-ledger"
SCHEMA = 1
#: Seconds between writes of the changed blocks: what a killed agent can lose (the fault suite's load stores
#: several MiB a second per node); a commit costs little (``synchronous=NORMAL``: no fsync but at checkpoints).
DEFAULT_FLUSH_INTERVAL = 0.1

_DDL = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS keyspaces (id INTEGER PRIMARY KEY, spec TEXT NOT NULL UNIQUE)",
    "CREATE TABLE IF NOT EXISTS blocks (keyspace INTEGER NOT NULL, block_hash BLOB NOT NULL, parent BLOB, "
    "size INTEGER NOT NULL, PRIMARY KEY (keyspace, block_hash)) WITHOUT ROWID",
)

#: A pending change: the key space, the raw hash, and (parent's raw hash, size) while present, None once removed.
_Change = tuple[KeySpace, bytes, tuple[bytes | None, int] | None]


class LedgerFileError(Exception):
    """The file is not a readable ledger file of this schema (it is moved aside)."""


def keyspace_spec(ks: KeySpace) -> str:
    """A key space as the JSON object of its constructor fields (sorted keys), the ``keyspaces.spec`` column."""
    values = {f.name: getattr(ks, f.name) for f in dataclasses.fields(ks) if f.init}
    return json.dumps(values, sort_keys=True, separators=(",", ":"))


class LedgerFile:
    """One ``ledger.sqlite3``: load its blocks, then keep it up to date from a ledger's events.

    Args:
        path: the SQLite file (created with its directory when missing; moved aside when unreadable).
        flush_interval: seconds between background writes (> 0).

    Use: ``blocks = f.load()``, ``ledger.restore(blocks)``, ``f.attach(ledger)``; ``close()`` at the end (writes
    what is pending). Thread-safe.
    """

    def __init__(self, path: str | Path, *, flush_interval: float = DEFAULT_FLUSH_INTERVAL) -> None:
        if flush_interval <= 0:
            raise ValueError(f"flush_interval must be positive seconds, got {flush_interval}")
        self.path = Path(path)
        self.flush_interval = flush_interval
        self.moved_aside: Path | None = None
        self.written = 0          # rows written or deleted by flushes
        self.flushes = 0
        self._db_lock = threading.Lock()
        self._ledger: Ledger | None = None
        # keyed by (id(keyspace), block hash): hashing a KeySpace's fields would cost the hot path; the change
        # holds the key space, so its id stays unique while it is pending
        self._pending: dict[tuple[int, bytes], _Change] = {}
        self._keyspace_ids: dict[int, tuple[KeySpace, int]] = {}  # id(keyspace) -> (keyspace, row id)
        self._spec_ids: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = self._connect()
        except (sqlite3.Error, LedgerFileError) as exc:
            self._move_aside(exc)
            self._db = self._connect()

    # --- opening ----------------------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        from agent.node.accounts import private_file

        private_file(self.path)  # 0600, and so its -wal and -shm files
        db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise LedgerFileError(f"quick_check: {check}")
            for statement in _DDL:
                db.execute(statement)
            db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?), ('schema', ?)", (FORMAT, str(SCHEMA)))
            meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
            if meta.get("format") != FORMAT or meta.get("schema") != str(SCHEMA):
                raise LedgerFileError(f"format {meta.get('format')!r} schema {meta.get('schema')!r}, expected "
                                      f"{FORMAT!r} schema {SCHEMA}")
        except BaseException:
            db.close()
            raise
        return db

    def _move_aside(self, why: BaseException) -> None:
        stamp, n = int(time.time()), 0
        target = self.path.with_name(f"{self.path.name}.bad-{stamp}")
        while target.exists():  # never overwrite an earlier one
            n += 1
            target = self.path.with_name(f"{self.path.name}.bad-{stamp}-{n}")
        for suffix in ("", "-wal", "-shm"):
            source = Path(str(self.path) + suffix)
            if source.exists():
                source.replace(Path(str(target) + suffix))
        self.moved_aside = target
        log.error("ledger file %s is unreadable (%s: %s): moved to %s; starting with an empty ledger", self.path,
                  type(why).__name__, why, target)

    # --- loading ----------------------------------------------------------------------------------------------

    def load(self) -> list[RestoredBlock]:
        """Every block in the file (in no particular order). A key space that no longer validates is skipped with
        its blocks (logged, rows deleted); an unreadable file is moved aside and an empty one started ([])."""
        try:
            with self._db_lock:
                return self._load()
        except (sqlite3.Error, LedgerFileError, ValueError, TypeError) as exc:
            with self._db_lock:
                self._db.close()
                self._move_aside(exc)
                self._db = self._connect()
                self._keyspace_ids.clear()
                self._spec_ids.clear()
            return []

    def _load(self) -> list[RestoredBlock]:
        keyspaces: dict[int, KeySpace] = {}
        bad: list[int] = []
        for ks_id, spec in self._db.execute("SELECT id, spec FROM keyspaces").fetchall():
            try:
                ks = KeySpace(**json.loads(spec))
            except (ValueError, TypeError) as exc:
                log.warning("ledger file %s: key space %d no longer valid, its blocks are dropped: %s", self.path,
                            ks_id, exc)
                bad.append(ks_id)
                continue
            keyspaces[ks_id] = ks
            self._spec_ids[spec] = ks_id
        if bad:
            self._db.executemany("DELETE FROM blocks WHERE keyspace = ?", [(i,) for i in bad])
            self._db.executemany("DELETE FROM keyspaces WHERE id = ?", [(i,) for i in bad])
        out: list[RestoredBlock] = []
        for ks_id, block_hash, parent, size in self._db.execute(
                "SELECT keyspace, block_hash, parent, size FROM blocks"):
            found = keyspaces.get(ks_id)
            if found is None:
                continue
            if not isinstance(block_hash, bytes) or not isinstance(size, int) or size < 0 \
                    or not (parent is None or isinstance(parent, bytes)):
                raise LedgerFileError(f"bad block row (keyspace {ks_id}): hash {block_hash!r:.40}, size {size!r}")
            out.append(RestoredBlock(found, block_hash, None if parent is None else found.primary_key(parent), size))
        return out

    # --- keeping it up to date --------------------------------------------------------------------------------

    def attach(self, ledger: Ledger) -> None:
        """Follow ``ledger``'s owned blocks from now on (a listener) and start the background writer."""
        if self._ledger is not None:
            raise RuntimeError(f"ledger file {self.path} already follows a ledger")
        self._ledger = ledger
        ledger.add_listener(self._on_event)
        self._thread = threading.Thread(target=self._run, name="kvpool-ledger-file", daemon=True)
        self._thread.start()

    def _on_event(self, event: str, table: ScopeTable, entry: BlockEntry) -> None:
        """Ledger listener (under the ledger's lock): note the block's new state for the next flush."""
        if event == "insert":
            parent = table.entries.get(entry.parent) if entry.parent is not None else None
            self._pending[(id(entry.keyspace), entry.block_hash)] = (
                entry.keyspace, entry.block_hash, (parent.block_hash if parent is not None else None, entry.size))
        elif event == "remove":
            self._pending[(id(entry.keyspace), entry.block_hash)] = (entry.keyspace, entry.block_hash, None)

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval):
            try:
                self.flush()
            except Exception:  # the disk: the changes stay pending, the next round retries
                log.exception("writing the ledger file %s failed", self.path)

    def flush(self) -> int:
        """Write every pending change in one transaction; returns how many blocks were written or deleted.

        Raises:
            sqlite3.Error: the disk failed (the changes stay pending).
        """
        ledger = self._ledger
        if ledger is None:
            return 0
        with self._db_lock:
            with ledger.lock:
                batch, self._pending = self._pending, {}
            if not batch:
                return 0
            try:
                self._write(batch)
            except BaseException:
                with ledger.lock:  # newer changes win over the failed batch
                    for key, row in batch.items():
                        self._pending.setdefault(key, row)
                raise
            self.written += len(batch)
            self.flushes += 1
            return len(batch)

    def _write(self, batch: dict[tuple[int, bytes], _Change]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            upserts: list[tuple[Any, ...]] = []
            deletes: list[tuple[int, bytes]] = []
            for ks, block_hash, state in batch.values():
                ks_id = self._keyspace_id(ks)
                if state is None:
                    deletes.append((ks_id, block_hash))
                else:
                    upserts.append((ks_id, block_hash, *state))
            if deletes:
                db.executemany("DELETE FROM blocks WHERE keyspace = ? AND block_hash = ?", deletes)
            if upserts:
                db.executemany("INSERT OR REPLACE INTO blocks (keyspace, block_hash, parent, size) VALUES (?, ?, ?, ?)",
                               upserts)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            # key space ids handed out inside the rolled-back transaction are gone with it
            self._keyspace_ids.clear()
            self._spec_ids.clear()
            raise

    def _keyspace_id(self, ks: KeySpace) -> int:
        held = self._keyspace_ids.get(id(ks))
        if held is not None:
            return held[1]
        spec = keyspace_spec(ks)
        found = self._spec_ids.get(spec)
        if found is None:
            self._db.execute("INSERT OR IGNORE INTO keyspaces (spec) VALUES (?)", (spec,))
            found = int(self._db.execute("SELECT id FROM keyspaces WHERE spec = ?", (spec,)).fetchone()[0])
            self._spec_ids[spec] = found
        self._keyspace_ids[id(ks)] = (ks, found)
        return found

    def stored_blocks(self) -> int:
        """Blocks in the file now (pending changes not counted)."""
        with self._db_lock:
            return int(self._db.execute("SELECT COUNT(*) FROM blocks").fetchone()[0])

    def close(self) -> None:
        """Stop the writer, write what is pending (a failure is logged) and close the file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        try:
            self.flush()
        except Exception:
            log.exception("writing the ledger file %s at close failed", self.path)
        with self._db_lock:
            self._db.close()


def open_ledger_file(ledger: Ledger, state_dir: str | Path, *,
                     flush_interval: float = DEFAULT_FLUSH_INTERVAL) -> LedgerFile:
    """Restore ``ledger`` from ``state_dir/ledger.sqlite3`` and keep the file following it (see the module
    docstring). Call before the daemon reports and before anything records into the ledger; reconcile with the
    Store afterwards. Never raises over the file's content (an unreadable one is moved aside)."""
    file = LedgerFile(Path(state_dir) / LEDGER_FILE, flush_interval=flush_interval)
    blocks = file.load()
    restored = ledger.restore(blocks)
    file.attach(ledger)
    if blocks:
        log.info("restored %d owned block(s) of %d scope(s) from %s (checked against the Store next)", restored,
                 len({b.keyspace.scope for b in blocks}), file.path)
    return file
