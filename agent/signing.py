"""Canonical encoding, digests and HMAC-SHA256 signatures of config documents.

The dashboard signs each config document with the node's ``signing_secret``; the agent verifies it before it
looks at anything else in the document. Both sides compute over the same bytes:

* **canonical encoding** = JSON with keys sorted, no insignificant whitespace, UTF-8, no NaN/Infinity
  (RFC 8785-like for the value types documents use: objects, arrays, strings, integers, booleans, null;
  documents carry no floats, so number formatting cannot differ between encoders);
* the ``signature`` member is removed before encoding (it cannot sign itself);
* **digest** = lowercase hex SHA-256 of the canonical encoding (64 characters);
* **signature** = lowercase hex HMAC-SHA256 of the canonical encoding keyed by the UTF-8 bytes of the secret.

The agent verifies over the document exactly as received (a dict decoded from the broker's JSON), never over
a re-serialised model, so a field the agent does not know still counts towards the signature.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SIGNATURE_FIELD = "signature"


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


def load_secret(path: str | Path) -> str:
    """Read a node's signing secret from ``path`` (surrounding whitespace stripped).

    Raises ``ValueError`` naming the file when it is empty, and ``OSError`` when it cannot be read.
    """
    secret = Path(path).read_text(encoding="utf-8").strip()
    if not secret:
        raise ValueError(f"signing secret file {path} is empty")
    return secret
