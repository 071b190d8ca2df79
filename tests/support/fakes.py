"""An in-memory stand-in for ``agent.datapath.store.StoreClient`` (unit tests only; integration tests use a real
master).

It copies bytes from and to the given pointers like the real zero-copy calls, and can be told to fail keys
with a given code (``fail``) or to lose objects (``evict``).
"""

from __future__ import annotations

import ctypes
import re
from typing import Any


class FakeStore:
    def __init__(self, tenant_id: str = "alpha") -> None:
        self.tenant_id = tenant_id
        self.objects: dict[str, bytes] = {}
        self.fail: dict[str, int] = {}
        self.registered: dict[int, int] = {}
        self.closed = False
        self.calls: list[str] = []
        self.configs: list[Any] = []

    # registration
    def register(self, ptr: int, size: int) -> None:
        self.registered[ptr] = size

    def unregister(self, ptr: int) -> None:
        self.registered.pop(ptr, None)

    def replicate_config(self, *, replica_num: int = 1, group_ids: Any = None, soft_pin: bool = False) -> Any:
        return {"replica_num": replica_num, "group_ids": group_ids, "soft_pin": soft_pin}

    # data
    def _put(self, key: str, pieces: list[tuple[int, int]]) -> int:
        if key in self.fail:
            return self.fail[key]
        self.objects[key] = b"".join(ctypes.string_at(p, s) for p, s in pieces)
        return 0

    def put_from(self, keys: list[str], ptrs: list[int], sizes: list[int], config: Any = None) -> list[int]:
        self.calls.append("put_from")
        self.configs.append(config)
        return [self._put(k, [(p, s)]) for k, p, s in zip(keys, ptrs, sizes)]

    def put_from_multi(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]],
                       config: Any = None) -> list[int]:
        self.calls.append("put_from_multi")
        self.configs.append(config)
        return [self._put(k, list(zip(p, s))) for k, p, s in zip(keys, ptrs, sizes)]

    def _get(self, key: str, pieces: list[tuple[int, int]]) -> int:
        if key in self.fail:
            return self.fail[key]
        data = self.objects.get(key)
        if data is None:
            return -704
        want = sum(s for _, s in pieces)
        if len(data) > want:
            return -600
        pos = 0
        for p, s in pieces:
            chunk = data[pos:pos + s]
            ctypes.memmove(p, chunk, len(chunk))
            pos += s
        return len(data)

    def get_into(self, keys: list[str], ptrs: list[int], sizes: list[int]) -> list[int]:
        self.calls.append("get_into")
        return [self._get(k, [(p, s)]) for k, p, s in zip(keys, ptrs, sizes)]

    def get_into_multi(self, keys: list[str], ptrs: list[list[int]], sizes: list[list[int]]) -> list[int]:
        self.calls.append("get_into_multi")
        return [self._get(k, list(zip(p, s))) for k, p, s in zip(keys, ptrs, sizes)]

    def exists(self, keys: list[str]) -> list[int]:
        self.calls.append("exists")
        return [1 if k in self.objects else 0 for k in keys]

    def remove(self, keys: list[str], *, force: bool = True) -> list[int]:
        self.calls.append("remove")
        return [self.fail[k] if k in self.fail else (0 if self.objects.pop(k, None) is not None else -704)
                for k in keys]

    def size_of(self, key: str) -> int:
        data = self.objects.get(key)
        return -704 if data is None else len(data)

    def remove_by_regex(self, pattern: str, *, force: bool = True) -> int:
        rx = re.compile(pattern)
        gone = [k for k in self.objects if rx.search(k)]
        for k in gone:
            del self.objects[k]
        return len(gone)

    def evict(self, keys: list[str]) -> None:
        for k in keys:
            self.objects.pop(k, None)


class HoldsEverything(FakeStore):
    """A ``FakeStore`` that finds every key it is asked about (every write an engine reported landed)."""

    def exists(self, keys: list[str]) -> list[int]:
        self.calls.append("exists")
        return [1] * len(keys)
