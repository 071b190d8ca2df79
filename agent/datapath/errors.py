"""Typed errors of the node agent's data path (no Django).

Mooncake Store 0.3.13.post1 reports failures as negative integers, per key in batch calls. This module names
them (``ERROR_NAMES``) and turns them into exceptions that carry the operation, the tenant, the code and the
keys it hit, so a log line or an HTTP 4xx/5xx body can say exactly which block failed and why.

Code values come from Mooncake's ``ErrorCode`` enum (``mooncake-store/include/types.h``); the tenant codes
-1700 (quota exceeded) and -1701 (tenant not registered) are observed on the 0.3.13.post1 master in
multi-tenant mode. -1702 (tenant not empty) follows those two in the enum's order in that build.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agent.datapath.connector import PutResult

#: Mooncake Store ``ErrorCode`` value -> name.
ERROR_NAMES: dict[int, str] = {
    0: "OK",
    -1: "INTERNAL_ERROR",
    -10: "BUFFER_OVERFLOW",
    -100: "SHARD_INDEX_OUT_OF_RANGE",
    -101: "SEGMENT_NOT_FOUND",
    -102: "SEGMENT_ALREADY_EXISTS",
    -103: "CLIENT_NOT_FOUND",
    -200: "NO_AVAILABLE_HANDLE",
    -300: "INVALID_VERSION",
    -400: "INVALID_KEY",
    -500: "WRITE_FAIL",
    -600: "INVALID_PARAMS",
    -601: "ILLEGAL_CLIENT",
    -700: "INVALID_WRITE",
    -701: "INVALID_READ",
    -702: "INVALID_REPLICA",
    -703: "REPLICA_IS_NOT_READY",
    -704: "OBJECT_NOT_FOUND",
    -705: "OBJECT_ALREADY_EXISTS",
    -706: "OBJECT_HAS_LEASE",
    -707: "LEASE_EXPIRED",
    -708: "OBJECT_HAS_REPLICATION_TASK",
    -709: "OBJECT_NO_REPLICATION_TASK",
    -710: "REPLICA_NOT_FOUND",
    -711: "REPLICA_ALREADY_EXISTS",
    -712: "REPLICA_IS_GONE",
    -800: "TRANSFER_FAIL",
    -900: "RPC_FAIL",
    -1000: "ETCD_OPERATION_ERROR",
    -1001: "ETCD_KEY_NOT_EXIST",
    -1002: "ETCD_TRANSACTION_FAIL",
    -1003: "ETCD_CTX_CANCELLED",
    -1010: "UNAVAILABLE_IN_CURRENT_STATUS",
    -1011: "UNAVAILABLE_IN_CURRENT_MODE",
    -1100: "FILE_NOT_FOUND",
    -1101: "FILE_OPEN_FAIL",
    -1102: "FILE_READ_FAIL",
    -1103: "FILE_WRITE_FAIL",
    -1104: "FILE_INVALID_BUFFER",
    -1105: "FILE_LOCK_FAIL",
    -1106: "FILE_INVALID_HANDLE",
    -1200: "BUCKET_NOT_FOUND",
    -1201: "BUCKET_ALREADY_EXISTS",
    -1202: "KEYS_EXCEED_BUCKET_LIMIT",
    -1203: "KEYS_ULTRA_LIMIT",
    -1300: "UNABLE_OFFLOAD",
    -1301: "UNABLE_OFFLOADING",
    -1400: "TASK_NOT_FOUND",
    -1401: "TASK_PENDING_LIMIT_EXCEEDED",
    -1700: "TENANT_QUOTA_EXCEEDED",
    -1701: "TENANT_NOT_REGISTERED",
    -1702: "TENANT_NOT_EMPTY",
}

#: How many keys an error message lists before it says "and N more".
_KEYS_IN_MESSAGE = 3


def error_name(code: int) -> str:
    """Name of a Mooncake return code (``"UNKNOWN_ERROR"`` for values the table does not know)."""
    return ERROR_NAMES.get(code, "UNKNOWN_ERROR")


class AgentError(Exception):
    """Base class of every error the agent's data path raises on purpose."""


class LayoutError(AgentError, ValueError):
    """The KV cache tensors, block ids or hashes given to the connector do not fit its description."""


class StoreError(AgentError):
    """A Mooncake Store call returned a negative code for one or more keys.

    Attributes:
        op: the store operation (``"put"``, ``"get"``, ``"exist"``, ``"remove"``, ``"setup"``, ...).
        code: the code that chose this exception's class (the first failing key's code).
        keys: every key that failed, in call order.
        failures: ``(key, code)`` per failing key; codes may differ between keys of one batch.
        tenant_id: the Mooncake tenant of the client that made the call ("" when unknown).
        result: for a failed ``put`` of the connector, what happened to every block of the batch
            (``agent.datapath.connector.PutResult``: stored, existing, failed, dropped); None otherwise.
    """

    #: the codes an exception class stands for; ``StoreError`` itself takes any code.
    codes: tuple[int, ...] = ()

    def __init__(self, op: str, failures: Sequence[tuple[str, int]], *, tenant_id: str = "",
                 detail: str = "", result: PutResult | None = None) -> None:
        if not failures:
            raise ValueError("StoreError needs at least one (key, code) failure")
        self.op = op
        self.failures: tuple[tuple[str, int], ...] = tuple((str(k), int(c)) for k, c in failures)
        self.keys: tuple[str, ...] = tuple(k for k, _ in self.failures)
        self.code: int = self.failures[0][1]
        self.tenant_id = tenant_id
        self.detail = detail
        self.result = result
        super().__init__(self._message())

    @property
    def code_name(self) -> str:
        """Mooncake name of :attr:`code`."""
        return error_name(self.code)

    def _message(self) -> str:
        by_code: dict[int, list[str]] = {}
        for key, code in self.failures:
            by_code.setdefault(code, []).append(key)
        parts = []
        for code, keys in by_code.items():
            shown = ", ".join(repr(k) for k in keys[:_KEYS_IN_MESSAGE])
            more = f" and {len(keys) - _KEYS_IN_MESSAGE} more" if len(keys) > _KEYS_IN_MESSAGE else ""
            parts.append(f"{error_name(code)} ({code}) for {len(keys)} key(s): {shown}{more}")
        tenant = f" (tenant {self.tenant_id!r})" if self.tenant_id else ""
        detail = f"; {self.detail}" if self.detail else ""
        return f"store {self.op} failed{tenant}: " + "; ".join(parts) + detail


class QuotaExceeded(StoreError):
    """-1700: the master refused the write because the tenant is at its quota (multi-tenant mode)."""

    codes = (-1700,)


class UnknownTenant(StoreError):
    """-1701: the client's ``tenant_id`` has no policy on the master (multi-tenant mode)."""

    codes = (-1701,)


class TenantNotEmpty(StoreError):
    """-1702: the tenant still owns objects (a quota delete was refused)."""

    codes = (-1702,)


class ObjectNotFound(StoreError):
    """-704: the object is not in the store (never written, evicted, or removed)."""

    codes = (-704,)


class NoSpace(StoreError):
    """-200 / -10: no segment had room for the object (the master could not evict enough)."""

    codes = (-200, -10)


class TransferFailed(StoreError):
    """-800: the transfer engine failed to move the bytes."""

    codes = (-800,)


class RpcFailed(StoreError):
    """-900: the RPC to the master failed (master down or unreachable)."""

    codes = (-900,)


class InvalidParams(StoreError):
    """-600 / -601 / -400: the store rejected the arguments (bad key, size, client or config)."""

    codes = (-600, -601, -400)


class StoreUnavailable(AgentError, ConnectionError):
    """The Mooncake client could not be opened (master unreachable, setup refused)."""


_BY_CODE: dict[int, type[StoreError]] = {
    code: cls
    for cls in (QuotaExceeded, UnknownTenant, TenantNotEmpty, ObjectNotFound, NoSpace, TransferFailed,
                RpcFailed, InvalidParams)
    for code in cls.codes
}


def exception_class(code: int) -> type[StoreError]:
    """The :class:`StoreError` subclass that stands for ``code`` (``StoreError`` when none is specific)."""
    return _BY_CODE.get(code, StoreError)


def store_error(op: str, failures: Sequence[tuple[str, int]], *, tenant_id: str = "", detail: str = "",
                result: PutResult | None = None) -> StoreError:
    """Build the typed exception for ``failures`` (its class follows the first failure's code)."""
    return exception_class(int(failures[0][1]))(op, failures, tenant_id=tenant_id, detail=detail, result=result)


def failures_of(keys: Sequence[str], codes: Iterable[int]) -> list[tuple[str, int]]:
    """``(key, code)`` for every negative code of a per-key batch result."""
    return [(key, code) for key, code in zip(keys, codes) if code < 0]


def raise_for_codes(op: str, keys: Sequence[str], codes: Sequence[int], *, tenant_id: str = "") -> None:
    """Raise the typed :class:`StoreError` when any per-key ``codes`` entry is negative.

    Raises:
        StoreError: (a subclass chosen by the first failing code) naming every failing key and its code.
        LayoutError: when the store returned a different number of results than keys.
    """
    if len(codes) != len(keys):
        raise LayoutError(f"store {op} returned {len(codes)} results for {len(keys)} keys")
    failures = failures_of(keys, codes)
    if failures:
        raise store_error(op, failures, tenant_id=tenant_id)
