"""Freshness and replay checks of what the dashboard sends the agent (issue 16, item 10).

* **Config documents**: each delivery carries ``sent_at``, stamped and signed by the dashboard when it sends it
  (re-pushes of the current version included, ``dashboard.rollout.push.send_many``). The agent refuses a
  delivery sent more than ``max_age`` seconds ago, or more than ``skew`` seconds in the future (``stale``), so a
  captured document replayed later applies nowhere — also not on a fresh agent with an empty state directory —
  while the current version re-pushed after a long outage applies (its ``sent_at`` is new). A document without
  ``sent_at`` (a dashboard before it) still applies over an applied state (the version check stops regressions)
  but not on an agent without one: nothing there tells an old document from a current one.
* **Purge requests** (sent once per purge id): refused when ``issued_at`` is outside the same window, and when
  their ``purge_id`` already ran here: :class:`SeenPurges` remembers the ids of accepted purges in
  ``purges-seen.json`` in the state directory (0600), each until its ``issued_at`` leaves the window (older ones
  are refused as stale anyway), at most ``SEEN_PURGES_MAX`` of them.

Defaults mirror the dashboard: a push expires from its queue after ``KVPOOL_PUSH_EXPIRES_SECONDS`` (1 h), so a
delivery older than ``DEFAULT_MAX_AGE_SECONDS`` (2 h) is no legitimate one; clocks may differ by
``DEFAULT_CLOCK_SKEW_SECONDS`` (5 min, as ``KVPOOL_AGENT_CLOCK_SKEW_SECONDS``). No Django here.
"""
from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

#: Oldest delivery accepted (seconds since its ``sent_at`` / a purge's ``issued_at``).
DEFAULT_MAX_AGE_SECONDS = 2 * 3600
#: Furthest in the future a stamp may lie (seconds): clocks of dashboard and node differ a little.
DEFAULT_CLOCK_SKEW_SECONDS = 300
#: File of the purge ids already run, in the state directory.
SEEN_PURGES_FILE = "purges-seen.json"
#: Most purge ids remembered (the oldest go first beyond it).
SEEN_PURGES_MAX = 10_000


class NotFresh(ValueError):
    """A stamp outside the freshness window; the message says how old (or how far ahead) and the limit."""


def parse_stamp(text: str) -> datetime:
    """An ISO-8601 UTC stamp (``2026-12-01T12:00:00.000000Z``) as an aware datetime. Raises ``NotFresh``."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        raise NotFresh(f"{text!r} is not an ISO-8601 time") from None
    if moment.tzinfo is None:
        raise NotFresh(f"{text!r} names no time zone")
    return moment.astimezone(UTC)


def check_fresh(stamp: str, *, what: str, max_age: float = DEFAULT_MAX_AGE_SECONDS,
                skew: float = DEFAULT_CLOCK_SKEW_SECONDS, now: datetime | None = None) -> datetime:
    """Return the parsed ``stamp`` when it lies within [now - ``max_age``, now + ``skew``]; raise ``NotFresh``
    naming ``what`` (``"sent_at"``, ``"issued_at"``) otherwise."""
    moment = parse_stamp(stamp)
    now = now or datetime.now(UTC)
    age = (now - moment).total_seconds()
    if age > max_age:
        raise NotFresh(f"{what} {stamp} is {int(age)} s old, more than the {int(max_age)} s this agent accepts "
                       "(a replayed or long-delayed message; the dashboard re-sends current documents with a fresh "
                       "stamp)")
    if age < -skew:
        raise NotFresh(f"{what} {stamp} lies {int(-age)} s in the future, more than the {int(skew)} s of clock "
                       "skew this agent accepts (check the clocks of dashboard and node)")
    return moment


class SeenPurges:
    """Purge ids this node already accepted (module docstring), kept in ``path`` (JSON ``{purge_id: issued_at}``,
    0600, rewritten atomically). Thread-safe."""

    def __init__(self, path: Path, *, max_age: float = DEFAULT_MAX_AGE_SECONDS, limit: int = SEEN_PURGES_MAX) -> None:
        self.path = Path(path)
        self.max_age = max_age
        self.limit = limit
        self._lock = threading.Lock()
        self._seen: dict[str, str] = {}
        try:
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                self._seen = {str(k): str(v) for k, v in loaded.items()}
        except (OSError, ValueError):
            self._seen = {}

    def __contains__(self, purge_id: object) -> bool:
        return purge_id in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def remember(self, purge_id: str, issued_at: str, *, now: datetime | None = None) -> None:
        """Add ``purge_id`` (issued at ``issued_at``), drop ids whose stamp left the window and the oldest beyond
        ``limit``, and write the file (fsynced) before returning."""
        now = now or datetime.now(UTC)
        horizon = now - timedelta(seconds=self.max_age)
        with self._lock:
            self._seen[purge_id] = issued_at
            kept: dict[str, tuple[datetime, str]] = {}
            for pid, stamp in self._seen.items():
                try:
                    moment = parse_stamp(stamp)
                except NotFresh:
                    continue
                if moment >= horizon or pid == purge_id:
                    kept[pid] = (moment, stamp)
            newest = sorted(kept.items(), key=lambda item: item[1][0])[-self.limit:]
            self._seen = {pid: stamp for pid, (_, stamp) in newest}
            self._write()

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(self._seen, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path)


__all__ = ["DEFAULT_CLOCK_SKEW_SECONDS", "DEFAULT_MAX_AGE_SECONDS", "NotFresh", "SEEN_PURGES_FILE", "SeenPurges",
           "check_fresh", "parse_stamp"]
