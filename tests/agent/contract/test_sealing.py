"""Documents and purge requests sealed to their node (``agent.contract.sealing``): only that node's secret opens
them, an altered or moved envelope does not open, and the agent applies what it opened only after its signature
checks (issue 16, item 3)."""
from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest

from agent.contract import signing
from agent.contract.messages import PurgeRequest, signed_request
from agent.contract.sealing import SealError, envelope_key, is_sealed, seal, unseal
from agent.node.daemon import Daemon
from agent.node.purge import handle_purge
from tests.support.messages import document


def test_only_the_node_s_secret_opens_its_envelope():
    doc = document()
    envelope = seal(doc, "s3cret", node="node-a")
    assert is_sealed(envelope) and "salt-a" not in json.dumps(envelope)
    assert unseal(envelope, "s3cret", node="node-a") == doc
    assert seal(doc, "s3cret", node="node-a")["nonce"] != envelope["nonce"]  # a fresh nonce per message
    with pytest.raises(SealError, match="does not open") as info:
        unseal(envelope, "other-secret", node="node-a")
    assert info.value.reason == "undecryptable"
    with pytest.raises(SealError, match="addressed to node 'node-a'"):
        unseal(envelope, "s3cret", node="node-b")
    moved = {**envelope, "node": "node-b"}  # relabelled for another node with the same secret: the AAD differs
    with pytest.raises(SealError, match="does not open"):
        unseal(moved, "s3cret", node="node-b")
    flipped = bytearray(base64.b64decode(envelope["ciphertext"]))
    flipped[10] ^= 1
    with pytest.raises(SealError, match="does not open"):
        unseal({**envelope, "ciphertext": base64.b64encode(bytes(flipped)).decode()}, "s3cret", node="node-a")
    for bad in ({**envelope, "sealed": 2}, {**envelope, "extra": 1}, {**envelope, "nonce": "!!"}):
        with pytest.raises(SealError) as info:
            unseal(bad, "s3cret", node="node-a")
        assert info.value.reason == "invalid"


def test_the_envelope_key_is_not_the_hmac_key():
    assert envelope_key("s3cret") != b"s3cret" and len(envelope_key("s3cret")) == 32
    assert envelope_key("s3cret") != envelope_key("s3cret2")


def test_the_daemon_applies_sealed_documents_and_refuses_those_it_cannot_open(tmp_path, caplog):
    daemon = Daemon("node-a", "s3cret", tmp_path / "state", publish=lambda batch: None)
    try:
        ack = daemon.handle_document(seal(document(version=1), "s3cret", node="node-a"))
        assert ack["status"] == "applied" and ack["version"] == 1
        ack = daemon.handle_document(seal(document(version=2), "another-nodes-secret", node="node-a"))
        assert (ack["status"], ack["reason"]) == ("rejected", "undecryptable") and daemon.applied_version == 1
        inside = document(version=3)
        inside["instances"][0]["tenant_id"] = "intruder"  # sealed correctly, but the signature no longer matches
        ack = daemon.handle_document(seal(inside, "s3cret", node="node-a"))
        assert (ack["status"], ack["reason"]) == ("rejected", "bad_signature")
        assert "undecryptable" in caplog.text
    finally:
        daemon.stop()


def test_a_sealed_purge_request_runs_and_one_for_another_node_does_not():
    class Store:
        removed = 0

        def remove_by_regex(self, pattern: str, *, force: bool = True) -> int:
            Store.removed += 3
            return 3

    request = PurgeRequest(purge_id="p1", node="node-a", tenant_id="acme", engine="vllm", namespace="prod-a",
                           model="Qwen3-8B", served_model_name="qwen3-8b",
                           issued_at=signing.timestamp(datetime.now(UTC)))
    envelope = seal(signed_request(request, "s3cret"), "s3cret", node="node-a")
    result = handle_purge(envelope, node="node-a", secret="s3cret", open_store=lambda tenant: Store())
    assert (result["purge_id"], result["removed"], result["error"]) == ("p1", 3, "")
    foreign = handle_purge(seal(signed_request(request, "b"), "b", node="node-b"), node="node-a", secret="s3cret",
                           open_store=lambda tenant: Store())
    assert foreign["removed"] == 0 and "undecryptable" in foreign["error"] and Store.removed == 3
