"""Other traces for the eviction simulator: transforms of a real trace and synthetic generators.

They exist to check that an eviction policy is not fitted to one trace. Each function returns a list of
:class:`agent.sim.trace.TraceRequest` in timestamp order, with prefix ids (an id names its whole prefix).

Transforms of a trace (``TRANSFORMS``):

- ``first-half`` / ``second-half``: the requests before / from the median arrival time, times rebased to 0.
- ``shift-conversations``: each conversation keeps its own requests and gaps but starts at a random time in
  the trace span, so conversations overlap differently. A conversation is the set of requests sharing their
  first block that fewer than 1% of all requests contain (the first block below the shared system prompts).
- ``full-blocks``: drops each request's partial last block (``input_length`` not a multiple of the block
  size), as vLLM 0.33.0 and SGLang 0.5.23 store only full blocks; requests left with no block are dropped.

Synthetic traces (``SYNTHETIC``; full blocks only, ``input_length = blocks * block_tokens``):

- ``chat``: multi-turn conversations under 8 Zipf-popular system prompts; after each turn another follows
  with probability 0.72 whatever the turn (about 3.5 turns on average), after an exponential think time
  (mean 60 s); each turn appends 1-4 blocks to the whole previous prompt. Reuse is memoryless in time and in
  turns: the case LRU is built for, where structure carries no extra signal.
- ``docs``: retrieval-style: one of 4 system prompts, then one of 3,000 documents (4-40 blocks, Zipf 1.1
  popularity), then a one-off question (1-2 blocks). No conversation; frequency matters, recency little.
- ``mixed``: 50% one-off requests (5-60 unique blocks after a system prompt), 30% conversations (continuing
  with probability 0.61 after each turn) with log-normal think times (median 90 s), 20% document requests
  as in ``docs``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

from agent.sim.trace import FAST25_BLOCK_TOKENS, TraceRequest


def _rebuilt(reqs: Sequence[TraceRequest]) -> list[TraceRequest]:
    return sorted(reqs, key=lambda r: r.timestamp_ms)


def first_half(reqs: Sequence[TraceRequest], seed: int = 0) -> list[TraceRequest]:
    """Requests before the median arrival time, rebased to start at 0 ms."""
    ordered = _rebuilt(reqs)
    cut = ordered[len(ordered) // 2].timestamp_ms
    part = [r for r in ordered if r.timestamp_ms < cut] or ordered[:1]
    t0 = part[0].timestamp_ms
    return [TraceRequest(r.timestamp_ms - t0, r.input_length, r.output_length, r.hash_ids) for r in part]


def second_half(reqs: Sequence[TraceRequest], seed: int = 0) -> list[TraceRequest]:
    """Requests from the median arrival time on, rebased to start at 0 ms."""
    ordered = _rebuilt(reqs)
    cut = ordered[len(ordered) // 2].timestamp_ms
    part = [r for r in ordered if r.timestamp_ms >= cut]
    t0 = part[0].timestamp_ms
    return [TraceRequest(r.timestamp_ms - t0, r.input_length, r.output_length, r.hash_ids) for r in part]


def conversation_key(reqs: Sequence[TraceRequest], shared_fraction: float = 0.01) -> Callable[[TraceRequest], int]:
    """A function mapping a request to its conversation: its first block found in fewer than
    ``shared_fraction`` of all requests (its last block when every block is that common)."""
    freq = Counter(b for r in reqs for b in set(r.hash_ids))
    limit = max(2.0, shared_fraction * len(reqs))

    def key(req: TraceRequest) -> int:
        for block in req.hash_ids:
            if freq[block] < limit:
                return block
        return req.hash_ids[-1]

    return key


def shift_conversations(reqs: Sequence[TraceRequest], seed: int = 0) -> list[TraceRequest]:
    """Each conversation moved, as a whole, to a random start inside the trace span (gaps kept)."""
    rng = random.Random(seed)
    key = conversation_key(reqs)
    groups: dict[int, list[TraceRequest]] = defaultdict(list)
    for r in _rebuilt(reqs):
        groups[key(r)].append(r)
    start = min(r.timestamp_ms for r in reqs)
    span = max(r.timestamp_ms for r in reqs) - start
    out: list[TraceRequest] = []
    for conv in groups.values():
        length = conv[-1].timestamp_ms - conv[0].timestamp_ms
        offset = rng.randint(0, max(0, span - length)) - (conv[0].timestamp_ms - start)
        out.extend(
            TraceRequest(r.timestamp_ms + offset, r.input_length, r.output_length, r.hash_ids) for r in conv
        )
    return _rebuilt(out)


def full_blocks(
    reqs: Sequence[TraceRequest], seed: int = 0, block_tokens: int = FAST25_BLOCK_TOKENS
) -> list[TraceRequest]:
    """Requests without their partial last block; those left empty are dropped."""
    out = []
    for r in reqs:
        n = r.input_length // block_tokens
        if n:
            out.append(TraceRequest(r.timestamp_ms, n * block_tokens, r.output_length, r.hash_ids[:n]))
    return _rebuilt(out)


TRANSFORMS: dict[str, Callable[..., list[TraceRequest]]] = {
    "first-half": first_half,
    "second-half": second_half,
    "shift-conversations": shift_conversations,
    "full-blocks": full_blocks,
}


class _Ids:
    """Prefix ids: the same (parent, content) pair always gets the same id."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}
        self._next = itertools.count()

    def extend(self, prefix: list[int], contents: Sequence[object]) -> list[int]:
        out = list(prefix)
        for content in contents:
            parent = out[-1] if out else None
            out.append(self._ids.setdefault((parent, content), next(self._next)))
        return out


def _zipf_sampler(n: int, s: float, rng: random.Random) -> Callable[[], int]:
    weights = [1.0 / (i + 1) ** s for i in range(n)]
    cum = list(itertools.accumulate(weights))
    total = cum[-1]
    return lambda: bisect.bisect_left(cum, rng.random() * total)


def _request(ts_s: float, ids: list[int], block_tokens: int, rng: random.Random) -> TraceRequest:
    return TraceRequest(int(ts_s * 1000), len(ids) * block_tokens, rng.randint(1, 800), tuple(ids))


def synthetic(kind: str, n_requests: int = 12000, seed: int = 0, rate_per_s: float = 3.4,
              block_tokens: int = FAST25_BLOCK_TOKENS) -> list[TraceRequest]:
    """A synthetic trace of about ``n_requests`` requests arriving at ``rate_per_s`` (Poisson).

    ``kind``: ``chat``, ``docs`` or ``mixed`` (see the module docstring). Raises ``ValueError`` for another
    kind or ``n_requests < 1``.
    """
    if kind not in SYNTHETIC:
        raise ValueError(f"unknown synthetic trace {kind!r}; choose one of {', '.join(SYNTHETIC)}")
    if n_requests < 1:
        raise ValueError(f"n_requests must be >= 1, got {n_requests}")
    rng = random.Random(f"{kind}:{seed}")
    ids = _Ids()
    uniq = itertools.count()
    system_len = [rng.randint(2, 12) for _ in range(8)]
    pick_system = _zipf_sampler(len(system_len), 1.0, rng)
    doc_len = [rng.randint(4, 40) for _ in range(3000)]
    pick_doc = _zipf_sampler(len(doc_len), 1.1, rng)

    def system_prefix(i: int) -> list[int]:
        return ids.extend([], [("sys", i, k) for k in range(system_len[i])])

    def doc_request() -> list[int]:
        d = pick_doc()
        prefix = ids.extend(system_prefix(d % 4), [("doc", d, k) for k in range(doc_len[d])])
        return ids.extend(prefix, [("q", next(uniq)) for _ in range(rng.randint(1, 2))])

    def one_off() -> list[int]:
        return ids.extend(system_prefix(pick_system()), [("u", next(uniq)) for _ in range(rng.randint(5, 60))])

    # Conversations are generated whole, then all requests are merged in time order.
    events: list[tuple[float, int, list[int]]] = []
    t = 0.0
    order = itertools.count()
    while len(events) < n_requests:
        t += rng.expovariate(rate_per_s)
        roll = rng.random()
        if kind == "docs" or (kind == "mixed" and roll < 0.2):
            events.append((t, next(order), doc_request()))
        elif kind == "mixed" and roll < 0.7:
            events.append((t, next(order), one_off()))
        else:
            # A conversation: geometric turns (continue with p = e^-1/3 in chat, e^-1/2 in mixed).
            turns = 1 + int(rng.expovariate(1.0 / 3.0)) if kind == "chat" else 1 + int(rng.expovariate(0.5))
            prompt = ids.extend(system_prefix(pick_system()), [("c", next(uniq)) for _ in range(rng.randint(2, 20))])
            ts = t
            for _ in range(turns):
                events.append((ts, next(order), prompt))
                ts += rng.expovariate(1.0 / 60.0) if kind == "chat" else rng.lognormvariate(math.log(90.0), 1.0)
                prompt = ids.extend(prompt, [("c", next(uniq)) for _ in range(rng.randint(1, 4))])
    events.sort(key=lambda e: (e[0], e[1]))
    return [_request(ts, blocks, block_tokens, rng) for ts, _, blocks in events[:n_requests]]


SYNTHETIC = ("chat", "docs", "mixed")
