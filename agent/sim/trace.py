"""Reader and writer for prefix-block request traces in the Mooncake FAST'25 JSONL format.

One JSON object per line, as in the trace published with the Mooncake paper (FAST'25,
``conversation_trace.jsonl``)::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, ...]}

- ``timestamp``: arrival time in milliseconds (integer, >= 0).
- ``input_length`` / ``output_length``: prompt and generated length in tokens (integers, >= 0).
- ``hash_ids``: one id per prompt block of ``block_tokens`` tokens (512 in that trace; the last block may be
  partial), so ``len(hash_ids) == ceil(input_length / block_tokens)``. Id ``hash_ids[i]`` names the whole
  prefix ``hash_ids[:i + 1]``: two requests share block ``i`` only if they share everything before it. The
  same property holds for the chained block hashes of vLLM 0.33.0 and SGLang 0.5.23, which is why a store can
  rebuild the prefix tree from its keys.

The reader checks every line and raises :class:`TraceError` naming the file and line. No Django here.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

#: Tokens per block in the Mooncake FAST'25 trace.
FAST25_BLOCK_TOKENS = 512

_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(ValueError):
    """A trace line is malformed. ``str(err)`` reads ``PATH:LINE: what is wrong``.

    Attributes: ``path`` (str), ``line`` (1-based line number, 0 when the error is about the whole file),
    ``reason`` (the message without the location).
    """

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    ``timestamp_ms``: arrival in milliseconds; ``input_length`` / ``output_length``: tokens;
    ``hash_ids``: prefix block ids, root first; ``line``: 1-based line in the source file (0 if generated).
    """

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    line: int = 0

    @property
    def timestamp_s(self) -> float:
        """Arrival time in seconds."""
        return self.timestamp_ms / 1000.0

    def to_json(self) -> str:
        """The request as one JSONL line (without newline), in the FAST'25 field order."""
        return json.dumps(
            {
                "timestamp": self.timestamp_ms,
                "input_length": self.input_length,
                "output_length": self.output_length,
                "hash_ids": list(self.hash_ids),
            }
        )


def _int_field(obj: dict, name: str, path: str, lineno: int) -> int:
    value = obj[name]
    # bool is an int subclass in Python; a trace field that is true/false is a typo, not a count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(path, lineno, f"field {name!r} must be an integer, got {value!r}")
    if value < 0:
        raise TraceError(path, lineno, f"field {name!r} must be >= 0, got {value}")
    return value


def parse_line(
    text: str,
    *,
    path: str = "<trace>",
    lineno: int = 0,
    block_tokens: int | None = FAST25_BLOCK_TOKENS,
) -> TraceRequest:
    """Parse and check one JSONL line.

    ``block_tokens``: when set, ``len(hash_ids)`` must equal ``ceil(input_length / block_tokens)``; ``None``
    skips that check (for traces whose lengths are not in tokens).
    Raises :class:`TraceError` for invalid JSON, a non-object line, a missing or extra field, a non-integer
    or negative value, an empty or non-list ``hash_ids``, an id repeated inside one request, or a block count
    that does not match ``input_length``.
    """
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(path, lineno, f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise TraceError(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
    missing = [f for f in _FIELDS if f not in obj]
    if missing:
        raise TraceError(path, lineno, f"missing field(s) {', '.join(missing)}")
    extra = sorted(set(obj) - set(_FIELDS))
    if extra:
        raise TraceError(path, lineno, f"unknown field(s) {', '.join(extra)}")
    timestamp = _int_field(obj, "timestamp", path, lineno)
    input_length = _int_field(obj, "input_length", path, lineno)
    output_length = _int_field(obj, "output_length", path, lineno)
    raw_ids = obj["hash_ids"]
    if not isinstance(raw_ids, list) or not raw_ids:
        raise TraceError(path, lineno, "field 'hash_ids' must be a non-empty list of integers")
    for pos, block in enumerate(raw_ids):
        if isinstance(block, bool) or not isinstance(block, int):
            raise TraceError(path, lineno, f"hash_ids[{pos}] must be an integer, got {block!r}")
    hash_ids = tuple(raw_ids)
    if len(set(hash_ids)) != len(hash_ids):
        seen: set[int] = set()
        for dup in hash_ids:  # stops at the first id seen before
            if dup in seen:
                break
            seen.add(dup)
        raise TraceError(path, lineno, f"hash_ids repeats block {dup}: a prefix cannot contain itself")
    if block_tokens is not None:
        expected = math.ceil(input_length / block_tokens)
        if expected != len(hash_ids):
            raise TraceError(
                path,
                lineno,
                f"{len(hash_ids)} hash_ids for input_length {input_length}: expected "
                f"ceil({input_length}/{block_tokens}) = {expected}",
            )
    return TraceRequest(timestamp, input_length, output_length, hash_ids, lineno)


def iter_trace(
    source: str | os.PathLike[str] | IO[str],
    *,
    block_tokens: int | None = FAST25_BLOCK_TOKENS,
    check_prefixes: bool = True,
) -> Iterator[TraceRequest]:
    """Yield the requests of a JSONL trace in file order, checking each line (see :func:`parse_line`).

    ``source``: a path or an open text file. Blank lines are skipped. With ``check_prefixes`` the reader also
    checks that every block id has one parent across the whole file (the prefix property above) and raises a
    :class:`TraceError` naming both lines otherwise; this keeps a dict of one entry per distinct block.
    Raises :class:`TraceError` (also when the file has no request) and ``OSError`` when it cannot be read.
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        with open(path, encoding="utf-8") as fh:
            yield from _iter_lines(fh, path, block_tokens, check_prefixes)
    else:
        yield from _iter_lines(source, getattr(source, "name", "<trace>"), block_tokens, check_prefixes)


def _iter_lines(
    fh: Iterable[str], path: str, block_tokens: int | None, check_prefixes: bool
) -> Iterator[TraceRequest]:
    parents: dict[int, tuple[int | None, int]] = {}
    count = 0
    for lineno, text in enumerate(fh, start=1):
        if not text.strip():
            continue
        req = parse_line(text, path=path, lineno=lineno, block_tokens=block_tokens)
        if check_prefixes:
            parent: int | None = None
            for block in req.hash_ids:
                known = parents.get(block)
                if known is None:
                    parents[block] = (parent, lineno)
                elif known[0] != parent:
                    raise TraceError(
                        path,
                        lineno,
                        f"block {block} follows {parent} here but {known[0]} on line {known[1]}: "
                        "hash_ids are not prefix ids",
                    )
                parent = block
        count += 1
        yield req
    if count == 0:
        raise TraceError(path, 0, "no requests in trace")


def read_trace(
    source: str | os.PathLike[str] | IO[str],
    *,
    block_tokens: int | None = FAST25_BLOCK_TOKENS,
    check_prefixes: bool = True,
) -> list[TraceRequest]:
    """Read a whole trace into a list (file order). Same checks and errors as :func:`iter_trace`."""
    return list(iter_trace(source, block_tokens=block_tokens, check_prefixes=check_prefixes))


def sorted_by_time(requests: Iterable[TraceRequest]) -> list[TraceRequest]:
    """Requests in timestamp order; requests with equal timestamps keep their file order (stable sort)."""
    return sorted(requests, key=lambda r: r.timestamp_ms)


def write_trace(path: str | os.PathLike[str], requests: Iterable[TraceRequest]) -> int:
    """Write requests as FAST'25 JSONL (one object per line). Returns the number of lines written."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for req in requests:
            fh.write(req.to_json())
            fh.write("\n")
            n += 1
    return n
