"""Dashboard → agent messages encrypted to their node: no seed or salt readable on the broker.

Config documents carry every instance's ``hash_seed`` and request-group ``cache_salt`` values, which let whoever
reads them forge the node's block hashes; purge requests name what to delete. The dashboard signs each one
(``agent.contract.signing``) and then **seals** it for its node; the agent unseals it with its node secret and
verifies the signature of what came out. A reader of the ``agent.<node>`` queue (another node's Redis credentials,
a broker backup, ``MONITOR``) sees ciphertext only.

Envelope (version 1), the only argument of the Celery task::

    {"sealed": 1, "node": "<node name>", "nonce": "<base64, 12 bytes>", "ciphertext": "<base64>"}

* cipher: AES-256-GCM (``cryptography``), a fresh random 96-bit nonce per message;
* key: HKDF-SHA256 of the node's signing secret (UTF-8), no salt, ``info`` = ``ENVELOPE_KEY_INFO``: a key of its
  own, distinct from the HMAC key (the secret itself), so one use of the secret cannot stand in for the other;
* associated data: the canonical encoding of ``{"sealed": 1, "node": ...}``, so an envelope cannot be moved to
  another node's queue or version;
* plaintext: the signed message's JSON: its canonical encoding (``seal``), or the canonical encoding of the
  unsigned message with the ``signature`` member appended (``seal_bytes`` of ``agent.contract.signing.signed_bytes``:
  one encoding instead of two); the agent decodes it and verifies over the canonical encoding of what came out.

:func:`seal` and :func:`unseal` are the two halves; :func:`is_sealed` tells an envelope from a plain (signed, not
encrypted) message, which agents still accept from dashboards that predate sealing.
"""
from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: Envelope version this side writes and reads.
ENVELOPE_VERSION = 1
#: Envelope member that marks (and versions) a sealed message.
SEALED_FIELD = "sealed"
#: HKDF ``info`` of the envelope key (a new version of the envelope gets a new one).
ENVELOPE_KEY_INFO = b"kvpool broker envelope v1: AES-256-GCM key of one node"
#: Largest ciphertext accepted (bytes): a document with its caps is far below.
MAX_CIPHERTEXT_BYTES = 16 << 20
_NONCE_BYTES = 12


class SealError(ValueError):
    """An envelope that cannot be opened; ``reason`` is ``undecryptable`` (wrong key, tampered, another node's) or
    ``invalid`` (not an envelope of a version this side reads)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@lru_cache(maxsize=4096)
def envelope_key(secret: str) -> bytes:
    """The 32-byte AES-256-GCM key of the node whose signing secret is ``secret`` (HKDF-SHA256, module docstring).
    Raises ``ValueError`` for an empty secret."""
    if not secret:
        raise ValueError("signing secret is empty")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=ENVELOPE_KEY_INFO).derive(secret.encode("utf-8"))


def _aad(node: str) -> bytes:
    return json.dumps({SEALED_FIELD: ENVELOPE_VERSION, "node": node}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def is_sealed(raw: Any) -> bool:
    """Whether ``raw`` is an envelope (of any version) rather than a plain message."""
    return isinstance(raw, Mapping) and SEALED_FIELD in raw


def seal(message: Mapping[str, Any], secret: str, *, node: str) -> dict[str, Any]:
    """The envelope of ``message`` (a signed wire dict) for ``node``, whose signing secret is ``secret``.

    Raises ``ValueError`` for an empty secret and ``TypeError`` for values JSON cannot hold."""
    plaintext = json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                           allow_nan=False).encode("utf-8")
    return seal_bytes(plaintext, secret, node=node)


def seal_bytes(plaintext: bytes, secret: str, *, node: str) -> dict[str, Any]:
    """The envelope of a message already encoded as JSON (``plaintext``, UTF-8; e.g.
    ``agent.contract.signing.signed_bytes``) for ``node``. Raises ``ValueError`` for an empty secret."""
    nonce = os.urandom(_NONCE_BYTES)
    ciphertext = AESGCM(envelope_key(secret)).encrypt(nonce, plaintext, _aad(node))
    return {SEALED_FIELD: ENVELOPE_VERSION, "node": node, "nonce": base64.b64encode(nonce).decode("ascii"),
            "ciphertext": base64.b64encode(ciphertext).decode("ascii")}


def unseal(envelope: Mapping[str, Any], secret: str, *, node: str) -> dict[str, Any]:
    """Open an envelope addressed to ``node`` with ``secret``; returns the message inside (still to be verified).

    Raises:
        SealError: ``invalid`` — not an envelope this side reads (version, members, sizes, not JSON inside);
            ``undecryptable`` — addressed to another node, sealed with another secret, or altered.
    """
    version = envelope.get(SEALED_FIELD)
    if version != ENVELOPE_VERSION or isinstance(version, bool):
        raise SealError("invalid", f"envelope version {version!r} is not {ENVELOPE_VERSION}")
    if set(envelope) != {SEALED_FIELD, "node", "nonce", "ciphertext"}:
        raise SealError("invalid", "envelope members must be sealed, node, nonce, ciphertext")
    if envelope.get("node") != node:
        raise SealError("undecryptable", f"envelope is addressed to node {envelope.get('node')!r}, this is {node!r}")
    nonce_text, text = envelope.get("nonce"), envelope.get("ciphertext")
    if not isinstance(nonce_text, str) or not isinstance(text, str) or len(text) > MAX_CIPHERTEXT_BYTES * 4 // 3 + 4:
        raise SealError("invalid", "envelope nonce and ciphertext must be base64 strings of bounded size")
    try:
        nonce = base64.b64decode(nonce_text, validate=True)
        ciphertext = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise SealError("invalid", "envelope nonce or ciphertext is not base64") from None
    if len(nonce) != _NONCE_BYTES:
        raise SealError("invalid", f"envelope nonce must be {_NONCE_BYTES} bytes")
    try:
        plaintext = AESGCM(envelope_key(secret)).decrypt(nonce, ciphertext, _aad(node))
    except InvalidTag:
        raise SealError("undecryptable", "envelope does not open with this node's secret (sealed for another "
                                         "node or secret, or altered)") from None
    try:
        message = json.loads(plaintext)
    except ValueError:
        raise SealError("invalid", "envelope holds no JSON") from None
    if not isinstance(message, dict):
        raise SealError("invalid", "envelope holds no JSON object")
    return message


__all__ = ["ENVELOPE_VERSION", "SealError", "envelope_key", "is_sealed", "seal", "seal_bytes", "unseal"]
