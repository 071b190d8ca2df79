"""Canonical encoding, HMAC signatures and message schemas (agent.contract.signing, agent.contract.messages)."""
from __future__ import annotations

import copy
from datetime import UTC

import pytest

from agent.contract import signing
from agent.contract.messages import MessageError, parse_document, parse_ingest
from tests.support.messages import ack, document, heartbeat, report


def test_canonical_bytes_ignore_key_order_and_signature():
    a = {"b": 1, "a": [1, {"y": "é", "x": None}], "signature": "zz"}
    b = {"a": [1, {"x": None, "y": "é"}], "b": 1}
    assert signing.canonical_bytes(a) == signing.canonical_bytes(b) == '{"a":[1,{"x":null,"y":"é"}],"b":1}'.encode()
    assert signing.digest(a) == signing.digest(b)
    assert len(signing.digest(a)) == 64


def test_signed_document_verifies_and_any_change_breaks_it():
    doc = document()
    signing.verify(doc, "s3cret")
    tampered = copy.deepcopy(doc)
    tampered["instances"][0]["request_groups"][1]["cache_salt"] = "other"
    with pytest.raises(signing.SignatureError) as info:
        signing.verify(tampered, "s3cret")
    assert info.value.reason == "bad_signature"
    with pytest.raises(signing.SignatureError) as info:
        signing.verify(doc, "another-nodes-secret")
    assert info.value.reason == "bad_signature"


def test_unsigned_document_is_refused():
    with pytest.raises(signing.SignatureError) as info:
        signing.verify(document(secret=None), "s3cret")
    assert info.value.reason == "unsigned"


def test_empty_secret_is_refused(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        signing.sign({"a": 1}, "")
    path = tmp_path / "secret"
    path.write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        signing.load_secret(path)
    path.write_text("abc\n")
    assert signing.load_secret(path) == "abc"


def test_document_schema_names_the_bad_field():
    doc = document()
    doc["instances"][0]["engine"] = "tgi"
    with pytest.raises(MessageError, match=r"instances\.0\.engine"):
        parse_document(doc)
    doc = document()
    doc["version"] = 0
    with pytest.raises(MessageError, match="version"):
        parse_document(doc)


def test_duplicate_instance_ids_are_refused():
    doc = document()
    doc["instances"].append(doc["instances"][0])
    with pytest.raises(MessageError, match="appears twice"):
        parse_document(doc)


@pytest.mark.parametrize("builder", [report, ack, heartbeat])
def test_ingest_messages_round_trip(builder):
    wire = builder(secret=None)
    assert parse_ingest(wire).to_wire() == wire


def test_ingest_refuses_unknown_schema_kind_and_fields():
    with pytest.raises(MessageError, match="unsupported schema 3"):
        parse_ingest({**report(), "schema": 3})
    with pytest.raises(MessageError, match="unsupported schema 1"):
        parse_ingest({**report(), "schema": 1})  # schema-1 reports are read through dashboard.telemetry.compat
    with pytest.raises(MessageError, match="unsupported schema 2"):
        parse_ingest({**heartbeat(), "schema": 2})  # only the report is at schema 2
    with pytest.raises(MessageError, match="kind"):
        parse_ingest({**report(), "kind": "metrics"})
    with pytest.raises(MessageError, match="Extra inputs"):
        parse_ingest({**heartbeat(), "cpu": 3})
    bad = report()
    bad["scopes"][0]["bytes"] = -1
    with pytest.raises(MessageError, match=r"scopes\.0\.bytes"):
        parse_ingest(bad)


def test_sign_message_stamps_the_sending_time_and_re_signs_on_every_attempt():
    from datetime import datetime, timedelta

    first_at = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    unsigned = report(secret=None)
    first = signing.sign_message(unsigned, "k", now=first_at)
    assert first["signed_at"] == "2026-11-30T12:00:00.000000Z" and "signature" in first
    signing.verify(first, "k")
    again = signing.sign_message(first, "k", now=first_at + timedelta(minutes=5))
    signing.verify(again, "k")
    assert again["signed_at"] != first["signed_at"] and again["signature"] != first["signature"]
    assert {k: v for k, v in again.items() if k not in ("signed_at", "signature")} == {
        k: v for k, v in unsigned.items() if k not in ("signed_at", "signature")}
    with pytest.raises(signing.SignatureError):
        signing.verify({**first, "signed_at": again["signed_at"]}, "k")  # the time is signed too
    with pytest.raises(ValueError, match="timezone-aware"):
        signing.sign_message(unsigned, "k", now=datetime(2026, 1, 1))


def test_signer_among_names_the_key_that_signed():
    message = signing.sign_message(report(secret=None), "key-b")
    assert signing.signer_among(message, [("node-a", "key-a"), ("node-b", "key-b")]) == "node-b"
    assert signing.signer_among(message, [("node-a", "key-a")]) is None
    assert signing.signer_among(report(secret=None), [("node-b", "key-b")]) is None
