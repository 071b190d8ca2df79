"""``dashboard.broker_json``: task bodies decode to what kombu's own JSON decoder returns."""
from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime

import pytest
from kombu import serialization
from kombu.utils import json as kombu_json

from dashboard.broker_json import loads, use_for_json


@pytest.mark.parametrize("text", [
    '[[[{"node": "n1", "scopes": [{"blocks": 3}], "x": null}]], {}, {"callbacks": null}]',
    '{"big": 123456789012345678901234567890, "neg": -1, "f": 1.5, "e": 1e16, "s": "\\u00e9\\n\\ud83d\\ude00"}',
    '{"a": 1, "a": 2}', '[1, 2 ]', '"text"',
])
def test_plain_json_decodes_as_kombu_decodes(text):
    assert loads(text) == kombu_json.loads(text)
    assert loads(text.encode()) == kombu_json.loads(text)


def test_what_msgspec_reads_otherwise_is_left_to_kombu():
    assert math.isnan(loads('{"v": NaN}')["v"])
    assert loads('{"v": 1e400}')["v"] == math.inf
    assert loads('{"v": "\\ud800"}') == {"v": "\ud800"}
    moment, ident = datetime(2026, 12, 1, tzinfo=UTC), uuid.uuid4()
    text = kombu_json.dumps({"at": moment, "id": ident})  # kombu's {"__type__": ..., "__value__": ...} markers
    assert loads(text) == {"at": moment, "id": ident}
    with pytest.raises(ValueError):
        loads('{"unterminated": ')


def test_registered_for_application_json():
    use_for_json()
    body = '[[[{"node": "n1"}]], {}, {}]'
    assert serialization.loads(body, "application/json", "utf-8") == [[[{"node": "n1"}]], {}, {}]
    assert serialization.registry._decoders["application/json"] is loads
