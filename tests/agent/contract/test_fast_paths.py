"""The fast paths of signature checks and report validation accept and refuse exactly what the reference paths do
(``agent.contract.signing.verify`` over msgspec bytes; ``parse_report_rows`` with ``ScopeRow``)."""
from __future__ import annotations

import hashlib
import hmac
import json

import msgspec
import pytest

from agent.contract import signing
from agent.contract.messages import (
    MAX_BYTES,
    MAX_COUNT,
    MessageError,
    Report,
    ScopeOccupancy,
    ScopeRow,
    parse_ingest,
    parse_report_rows,
)
from tests.support.messages import heartbeat, report


def _python_signed(document: dict, secret: str) -> dict:
    """Signed over ``json``'s canonical bytes, as every agent signs (not through the fast path)."""
    payload = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                         allow_nan=False).encode()
    return {**document, "signature": hmac.new(secret.encode(), payload, hashlib.sha256).hexdigest()}


@pytest.mark.parametrize("extra", [
    {"text": "\x7f\u2028é😀\x00\t\"\\/"}, {"big": 2 ** 70}, {"neg": -(2 ** 70)}, {"f": 1.5}, {"f": 1e16},
    {"f": 1e-7}, {"f": 5.0}, {"none": None}, {"nested": [{"b": 1, "a": [True, False]}]}, {"ä": 1, "z": 2},
])
def test_verify_accepts_what_the_canonical_bytes_sign(extra):
    document = _python_signed({"node": "n1", **extra}, "s3cret")
    signing.verify(document, "s3cret")
    with pytest.raises(signing.SignatureError):
        signing.verify({**document, "node": "n2"}, "s3cret")
    with pytest.raises(signing.SignatureError):
        signing.verify(document, "other")


def test_verify_refuses_nan_where_null_was_signed():
    """msgspec writes NaN as ``null``: a NaN put in place of a signed ``null`` must not verify."""
    document = _python_signed({"node": "n1", "version": None}, "s3cret")
    signing.verify(document, "s3cret")
    for value in (float("nan"), float("inf")):
        with pytest.raises(signing.SignatureError) as info:
            signing.verify({**document, "version": value}, "s3cret")
        assert info.value.reason == "bad_signature"


def test_verify_refuses_an_empty_secret_and_an_unencodable_document():
    document = _python_signed({"node": "n1"}, "s3cret")
    with pytest.raises(signing.SignatureError):
        signing.verify(document, "")
    with pytest.raises(signing.SignatureError):
        signing.verify({**document, "text": "\ud800"}, "s3cret")


def test_scope_row_has_the_fields_and_bounds_of_scope_occupancy():
    fields = msgspec.structs.fields(ScopeRow)
    assert [f.name for f in fields] == list(ScopeOccupancy.model_fields)
    assert [f.name for f in fields[:4]] == ["tenant_id", "served_model_name", "namespace", "request_group"]
    row = {"tenant_id": "acme", "served_model_name": "m", "namespace": "ns", "request_group": "g", "blocks": 3}
    assert msgspec.structs.asdict(msgspec.convert(row, ScopeRow)) == ScopeOccupancy(**row).model_dump()
    assert msgspec.convert(row, ScopeRow).scope == ScopeOccupancy(**row).scope


ROW = {"tenant_id": "acme", "served_model_name": "m", "namespace": "ns", "request_group": "g", "blocks": 3,
       "bytes": 1 << 20}


@pytest.mark.parametrize("change", [
    {}, {"blocks": -1}, {"tenant_id": ""}, {"unknown": 1}, {"blocks": "5"}, {"blocks": 5.0}, {"blocks": 5.5},
    {"blocks": True}, {"blocks": 2 ** 70}, {"blocks": None}, {"namespace": 3}, {"tenant_id": None},
    {"bytes": MAX_BYTES}, {"bytes": MAX_BYTES + 1}, {"bytes": 2 ** 63 - 1}, {"bytes": str(MAX_BYTES)},
    {"bytes": str(MAX_BYTES + 1)}, {"bytes": float(MAX_BYTES)}, {"bytes": float(2 ** 62)},
    {"blocks": MAX_COUNT}, {"hit_blocks": MAX_COUNT + 1}, {"orphan_removed_blocks": 2 ** 63},
])
def test_parse_report_rows_accepts_and_refuses_what_parse_ingest_does(change):
    raw = {**report(), "scopes": [{**ROW, **change}, ROW]}
    try:
        expected: Report | None = parse_ingest(raw)  # type: ignore[assignment]
    except MessageError as exc:
        with pytest.raises(MessageError) as info:
            parse_report_rows(raw)
        assert str(info.value) == str(exc)  # the same field named
        return
    message, rows = parse_report_rows(raw)
    assert isinstance(message, Report) and message.scopes == []
    assert [msgspec.structs.asdict(row) for row in rows] == [row.model_dump() for row in expected.scopes]
    assert message.model_copy(update={"scopes": expected.scopes}) == expected


def test_parse_report_rows_passes_other_messages_and_report_errors_through():
    beat = heartbeat()
    assert parse_report_rows(beat) == (parse_ingest(beat), None)
    with pytest.raises(MessageError):
        parse_report_rows({**report(), "sequence": 0})
    with pytest.raises(MessageError):
        parse_report_rows({**report(), "scopes": "x"})
