"""Agent side of a release purge: remove every Store key of one release namespace with ``remove_by_regex``.

The dashboard sends a signed :class:`PurgeRequest`, sealed to the node (``agent.contract.sealing``; Celery task
``agent.purge_namespace`` on queue ``agent.<node>``) after an operator confirmed the purge of a **retired**
release. The agent opens the envelope and verifies the HMAC signature with its node secret (the same scheme as
config documents, ``agent.contract.signing``), builds the regex of the release namespace from the key grammar
(``agent.contract.keys.release_regex``: every rank, group and block of the release's model under that namespace),
opens a Store client of the request's tenant, calls
``remove_by_regex`` and answers with a :class:`PurgeResult` (task ``dashboard.purge_result`` on queue
``dashboard.ingest``) carrying the number of objects the master removed.

Mooncake 0.3.13.post1: ``remove_by_regex(pattern, force)`` takes an ECMAScript regex, acts on the client's
tenant only and returns the count removed (negative on error). A tenant's keys are visible to every client of
that tenant, so the first agent to run a purge removes them all and later agents report 0.

No Django here: this module runs on the node.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from agent.contract import sealing, signing
from agent.contract.keys import release_keys_regex
from agent.contract.messages import (  # the purge messages live with every other wire format; re-exported here
    PURGE_RESULT_QUEUE,
    PURGE_RESULT_TASK,
    PURGE_TASK,
    MessageError,
    PurgeRequest,
    PurgeResult,
    signed_request,
    utcnow,
)
from agent.node.freshness import DEFAULT_CLOCK_SKEW_SECONDS, DEFAULT_MAX_AGE_SECONDS, NotFresh, SeenPurges, check_fresh

log = logging.getLogger("kvpool.agent.purge")

__all__ = ["PURGE_RESULT_QUEUE", "PURGE_RESULT_TASK", "PURGE_TASK", "PurgeRequest", "PurgeResult", "release_keys_regex",
           "signed_request"]

#: Bytes the purge client mounts into the pool while it runs (the smallest segment 0.3.13.post1 accepts).
PURGE_SEGMENT_BYTES = 16 << 20


class RegexStore(Protocol):
    """What a purge needs from ``agent.datapath.store.StoreClient``."""

    def remove_by_regex(self, pattern: str, *, force: bool = True) -> int: ...


def purge_release_keys(store: RegexStore, namespace: str, *, engine: str, model: str) -> int:
    """Remove every key of ``model`` under release ``namespace`` from ``store``'s tenant; returns the count.

    ``store`` is an open ``agent.datapath.store.StoreClient`` (or anything with ``remove_by_regex``).

    Raises:
        ValueError: see :func:`release_keys_regex`.
        agent.datapath.errors.StoreError: the store answered with a negative code.
    """
    pattern = release_keys_regex(engine, namespace, model)
    count = store.remove_by_regex(pattern, force=True)
    log.info("purged %d objects of release namespace %r (model %r, %s) with %s", count, namespace, model,
             engine, pattern)
    return count


def handle_purge(raw: Any, *, node: str, secret: str, open_store: Callable[[str], Any],
                 ledger: Any | None = None, seen: SeenPurges | None = None,
                 max_age: float = DEFAULT_MAX_AGE_SECONDS, skew: float = DEFAULT_CLOCK_SKEW_SECONDS) -> dict[str, Any]:
    """Verify, validate and run one purge request; return the :class:`PurgeResult` wire dict.

    Freshness and replay (``agent.node.freshness``): a request whose ``issued_at`` lies outside [now - ``max_age``,
    now + ``skew``] is refused (``stale: ...`` in the result's ``error``), and so is one whose ``purge_id`` is in
    ``seen`` (``replayed: ...``); an accepted one is added to ``seen`` before it runs. Without ``seen`` (tests,
    one-off calls) only the age is checked.

    ``open_store(tenant_id)`` returns an open Store client of that tenant; it is closed afterwards when it has
    a ``close`` method. ``ledger`` (the node's ``agent.datapath.ledger.Ledger``, optional) forgets the purged blocks, so
    the next occupancy report no longer counts them. Never raises for a bad request: a refused or failed purge
    comes back with ``error`` set and ``removed`` 0 (logged at WARNING); one without a readable ``purge_id``
    is answered as purge ``unknown``, which the dashboard matches to no request and drops.
    """
    removed, error = 0, ""
    purge_id = "unknown"
    try:
        if not isinstance(raw, dict):
            raise MessageError(f"expected a JSON object, got {type(raw).__name__}")
        if sealing.is_sealed(raw):
            try:
                raw = sealing.unseal(raw, secret, node=node)
            except sealing.SealError as exc:
                raise MessageError(f"{exc.reason}: {exc}") from None
        found = raw.get("purge_id")
        purge_id = found if isinstance(found, str) and 0 < len(found) <= 64 else "unknown"
        try:
            signing.verify(raw, secret)
        except signing.SignatureError as exc:
            raise MessageError(f"{exc.reason}: {exc}") from None
        try:
            request = PurgeRequest.model_validate(raw)
        except Exception as exc:  # pydantic ValidationError: name the fields
            raise MessageError(f"invalid purge request: {exc}") from None
        if request.node != node:
            raise MessageError(f"purge request is for node {request.node!r}, this is {node!r}")
        try:
            check_fresh(request.issued_at, what="issued_at", max_age=max_age, skew=skew)
        except NotFresh as exc:
            raise MessageError(f"stale: {exc}") from None
        if seen is not None:
            if request.purge_id in seen:
                raise MessageError(f"replayed: purge {request.purge_id} already ran on this node; not run again")
            seen.remember(request.purge_id, request.issued_at)
        release_keys_regex(request.engine, request.namespace, request.model)
        store = open_store(request.tenant_id)
        try:
            removed = purge_release_keys(store, request.namespace, engine=request.engine, model=request.model)
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                close()
        if ledger is not None:
            ledger.forget_release(tenant_id=request.tenant_id, served_model_name=request.served_model_name,
                                  namespace=request.namespace, engine=request.engine)
    except Exception as exc:  # reported back to the dashboard, never raised into the worker
        error = f"{type(exc).__name__}: {exc}"[:2000]
        log.warning("node %s: purge %s refused or failed: %s", node, purge_id, error)
    return PurgeResult(purge_id=purge_id, node=node, removed=removed, error=error, sent_at=utcnow()).to_wire()


def daemon_store_opener(daemon: Any, *, segment_bytes: int = PURGE_SEGMENT_BYTES) -> Callable[[str], Any]:
    """``open_store(tenant_id)`` for a running ``agent.node.daemon.Daemon``: the Store endpoints of its applied
    config document, with a small segment (``segment_bytes``) since the purge client stores nothing.

    Raises (when called) ``RuntimeError`` before the first document was applied, and the errors of
    ``agent.datapath.store.open_store``.
    """

    def open_store(tenant_id: str) -> Any:
        from agent.datapath.store import open_store as open_client

        current = daemon.current
        if current is None:
            raise RuntimeError("no config document applied yet: the Store endpoints are unknown")
        store = current.document.store
        endpoints = store.model_copy(update={
            "global_segment_size": segment_bytes,
            "local_buffer_size": min(store.local_buffer_size, segment_bytes) or segment_bytes})
        return open_client(endpoints, tenant_id)

    return open_store


def register_purge_task(app: Any, *, node: str, secret: str, open_store: Callable[[str], Any],
                        publish: Callable[[dict[str, Any]], None] | None = None, ledger: Any | None = None,
                        seen: SeenPurges | None = None) -> None:
    """Register ``agent.purge_namespace`` on the agent's Celery ``app``.

    Each request runs :func:`handle_purge` (with ``ledger``, the daemon's ledger, and ``seen``, the purge ids
    already run, ``purges-seen.json`` in the state directory, when given); the result goes
    back with ``publish(result)`` (default: the task ``dashboard.purge_result`` on queue ``dashboard.ingest``
    through ``app``). A result the broker does not take is logged; the dashboard shows the node as not answered
    and the operator can request again.
    """

    def default_publish(result: dict[str, Any]) -> None:
        app.send_task(PURGE_RESULT_TASK, args=[result], queue=PURGE_RESULT_QUEUE, declare=[], retry=True,
                      retry_policy={"max_retries": 3, "interval_start": 0, "interval_step": 0.5,
                                    "interval_max": 1.0})

    send = publish or default_publish

    @app.task(name=PURGE_TASK, ignore_result=True, shared=False)
    def purge_namespace(request: dict[str, Any]) -> dict[str, Any]:
        """Run one purge request and send its result, signed with the node's secret, to the dashboard."""
        result = signing.sign_message(
            handle_purge(request, node=node, secret=secret, open_store=open_store, ledger=ledger, seen=seen),
            secret)
        try:
            send(result)
        except Exception as exc:
            log.error("node %s: could not send purge result %s: %s", node, result.get("purge_id"), exc)
        return result
