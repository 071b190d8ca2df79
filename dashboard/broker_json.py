"""The dashboard's decoder of JSON broker messages: msgspec where it decodes to the same value, kombu's otherwise.

Celery decodes every task body the dashboard's workers receive — the agents' ``dashboard.ingest`` batches of
reports above all — with kombu's ``json.loads``, which calls a Python ``object_hook`` for every JSON object (to
revive kombu's ``{"__type__": …, "__value__": …}`` markers for dates, UUIDs and decimals): about 2x ``json.loads``,
4x msgspec, a large share of the ingest worker's time at fleet size. ``loads`` decodes with msgspec when the
text has no ``"__type__"`` marker, and falls back to kombu's own decoder for anything msgspec does not decode
to the same value (a marker, ``NaN``/``Infinity`` or a number out of a float's range, a lone surrogate): the
decoded value is the one kombu returns — except for a marker whose key is spelt with ``\\u`` escapes, which kombu's
encoder never writes: msgspec leaves it a plain object (kombu would revive it), so nothing is revived that the
text does not spell out. ``use_for_json`` registers it for ``application/json`` in this process
(``dashboard.celery``); encoding stays kombu's.
"""
from __future__ import annotations

from typing import Any

import msgspec
from kombu import serialization
from kombu.utils import json as kombu_json

_MARKER = '"__type__"'
_DECODER = msgspec.json.Decoder()


def loads(text: str | bytes | bytearray | memoryview) -> Any:
    """Decode one JSON broker message body (what kombu's ``json.loads`` returns for it); raises what kombu's
    decoder raises for malformed text."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text).decode("utf-8")
    if _MARKER not in text:
        try:
            return _DECODER.decode(text)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass  # not JSON msgspec reads the same way: kombu decides (and raises for malformed text)
    return kombu_json.loads(text)


def use_for_json() -> None:
    """Decode ``application/json`` message bodies with ``loads`` in this process (kombu's encoder kept)."""
    serialization.register("json", kombu_json.dumps, loads, content_type="application/json",
                           content_encoding="utf-8")
