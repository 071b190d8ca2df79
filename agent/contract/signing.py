"""Canonical encoding, digests and HMAC-SHA256 signatures of every message that crosses the broker.

Both directions use one key per node: the node's ``signing_secret`` (``tenants.models.Node``; the agent reads it
from ``--secret-file`` / ``$KVPOOL_NODE_SECRET``).

* dashboard → agent: the dashboard signs each config document and purge request; the agent verifies it before
  it looks at anything else in the document;
* agent → dashboard: the agent signs each ack, report, heartbeat and purge result **when it sends it**
  (``sign_message``: sets ``signed_at`` to the sending time, then ``signature``); the dashboard verifies it
  with the secret of the node the message names before it validates or stores anything
  (``dashboard.telemetry.agent_auth``). Messages wait unsigned in the agent's outbox (see ``agent.node.outbox``).

Both sides compute over the same bytes:

* **canonical encoding** = JSON with keys sorted, no insignificant whitespace, UTF-8, no NaN/Infinity
  (RFC 8785-like for the value types messages use: objects, arrays, strings, integers, booleans, null;
  messages carry no floats, so number formatting cannot differ between encoders);
* the ``signature`` member is removed before encoding (it cannot sign itself);
* **digest** = lowercase hex SHA-256 of the canonical encoding (64 characters);
* **signature** = lowercase hex HMAC-SHA256 of the canonical encoding keyed by the UTF-8 bytes of the secret.

The receiver verifies over the message exactly as received (a dict decoded from the broker's JSON), never over
a re-serialised model, so a field the receiver does not know still counts towards the signature.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SIGNATURE_FIELD = "signature"
#: Member of agent → dashboard messages: when the agent signed (= sent) the message, UTC ISO-8601 with "Z".
SIGNED_AT_FIELD = "signed_at"


class SignatureError(ValueError):
    """A document is unsigned or its signature does not match; ``reason`` is ``unsigned`` or ``bad_signature``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def canonical_bytes(document: Mapping[str, Any]) -> bytes:
    """Return the canonical JSON encoding of ``document`` without its ``signature`` member.

    Raises ``ValueError`` for floats that are NaN/Infinity and ``TypeError`` for values JSON cannot hold.
    """
    unsigned = {key: value for key, value in document.items() if key != SIGNATURE_FIELD}
    return json.dumps(
        unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def digest(document: Mapping[str, Any]) -> str:
    """Return the lowercase hex SHA-256 (64 chars) of ``canonical_bytes(document)``."""
    return hashlib.sha256(canonical_bytes(document)).hexdigest()


#: Member of dashboard → agent documents stamped at each delivery (``ConfigDocument.sent_at``): signed, but not
#: part of the document's identity (its digest), so a re-push of the same version acks the same digest.
SENT_AT_FIELD = "sent_at"


def document_digest(document: Mapping[str, Any]) -> str:
    """:func:`digest` of a config document without its per-delivery ``sent_at`` stamp: the version's digest, the
    same for every delivery of it (what the agent acks and the dashboard stored)."""
    return digest({key: value for key, value in document.items() if key != SENT_AT_FIELD})


def _key(secret: str | bytes) -> bytes:
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError("signing secret is empty")
    return key


def sign(document: Mapping[str, Any], secret: str | bytes) -> str:
    """Return the lowercase hex HMAC-SHA256 (64 chars) of the canonical encoding, keyed by ``secret``.

    Raises ``ValueError`` when ``secret`` is empty.
    """
    return hmac.new(_key(secret), canonical_bytes(document), hashlib.sha256).hexdigest()


def signed(document: Mapping[str, Any], secret: str | bytes) -> dict[str, Any]:
    """Return a copy of ``document`` with its ``signature`` member set."""
    result = {key: value for key, value in document.items() if key != SIGNATURE_FIELD}
    result[SIGNATURE_FIELD] = sign(result, secret)
    return result


def signed_bytes(document: Mapping[str, Any], secret: str | bytes) -> bytes:
    """JSON (UTF-8) of :func:`signed` ``(document, secret)`` from one canonical encoding: the canonical encoding of
    ``document`` with the ``signature`` member appended last. Decodes to the same object as ``signed`` gives (only
    the member order differs, which the canonical encoding the receiver verifies over does not keep).

    Raises ``ValueError`` when ``secret`` is empty or ``document`` is empty (nothing to sign) and ``TypeError``
    for values JSON cannot hold.
    """
    payload = canonical_bytes(document)
    if payload == b"{}":
        raise ValueError("document is empty")
    signature = hmac.new(_key(secret), payload, hashlib.sha256).hexdigest()
    return b"%s,\"%s\":\"%s\"}" % (payload[:-1], SIGNATURE_FIELD.encode("ascii"), signature.encode("ascii"))


def verify(document: Mapping[str, Any], secret: str | bytes) -> None:
    """Check the ``signature`` member of ``document`` in constant time.

    Raises ``SignatureError`` with reason ``unsigned`` when the member is missing or empty, and
    ``bad_signature`` when it does not match (a tampered document or a different secret).
    """
    signature = document.get(SIGNATURE_FIELD)
    if not isinstance(signature, str) or not signature:
        raise SignatureError("unsigned", "document carries no signature")
    try:
        expected = sign(document, secret)
    except (TypeError, ValueError) as exc:
        raise SignatureError("bad_signature", f"document cannot be canonically encoded: {exc}") from None
    if not hmac.compare_digest(expected, signature.lower()):
        raise SignatureError("bad_signature", "signature does not match the document (tampered or wrong secret)")


def timestamp(moment: datetime) -> str:
    """``moment`` as UTC ISO-8601 with microseconds and ``Z`` (``2026-11-30T12:00:00.000000Z``).

    Raises ``ValueError`` for a naive datetime (its zone would be a guess).
    """
    if moment.tzinfo is None:
        raise ValueError("timestamp needs a timezone-aware datetime")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def sign_message(message: Mapping[str, Any], secret: str | bytes, *, now: datetime | None = None) -> dict[str, Any]:
    """Return a copy of an agent → dashboard wire message, stamped and signed for sending.

    ``signed_at`` is set to ``now`` (default: the current UTC time) and ``signature`` to the HMAC of the result;
    a ``signed_at``/``signature`` the message already carries (an earlier delivery attempt) is replaced.
    Raises ``ValueError`` when ``secret`` is empty and ``TypeError`` for values JSON cannot hold.
    """
    body = {key: value for key, value in message.items() if key not in (SIGNATURE_FIELD, SIGNED_AT_FIELD)}
    body[SIGNED_AT_FIELD] = timestamp(now or datetime.now(UTC))
    return signed(body, secret)


def signer_among(document: Mapping[str, Any], secrets: Iterable[tuple[str, str]]) -> str | None:
    """The name of the first ``(name, secret)`` pair whose key produced the document's signature, else None.

    Tells "signed with another node's secret" from "tampered"; costs one HMAC per pair (callers bound it).
    """
    signature = document.get(SIGNATURE_FIELD)
    if not isinstance(signature, str) or not signature:
        return None
    try:
        payload = canonical_bytes(document)
    except (TypeError, ValueError):
        return None
    for name, secret in secrets:
        if secret and hmac.compare_digest(hmac.new(_key(secret), payload, hashlib.sha256).hexdigest(),
                                          signature.lower()):
            return name
    return None


def load_secret(path: str | Path) -> str:
    """Read a node's signing secret from ``path`` (surrounding whitespace stripped).

    Raises ``ValueError`` naming the file when it is empty, and ``OSError`` when it cannot be read.
    """
    secret = Path(path).read_text(encoding="utf-8").strip()
    if not secret:
        raise ValueError(f"signing secret file {path} is empty")
    return secret
