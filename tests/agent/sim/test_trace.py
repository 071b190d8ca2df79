"""agent/sim/trace.py: the FAST'25 JSONL reader, its checks and error messages."""

import io
import json
import os

import pytest

from agent.sim.trace import (
    TraceError,
    TraceRequest,
    iter_trace,
    parse_line,
    read_trace,
    sorted_by_time,
    write_trace,
)
from tests.support.paths import CONVERSATION_TRACE

# The FAST'25 trace lives in the shared/ folder beside the repository (as on CI).
REAL_TRACE = str(CONVERSATION_TRACE)


def line(**overrides):
    obj = {"timestamp": 5, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]}
    obj.update(overrides)
    return json.dumps(obj)


def test_parse_line_fields():
    req = parse_line(line(), lineno=3)
    assert req == TraceRequest(5, 1100, 7, (0, 1, 2), 3)
    assert req.timestamp_s == 0.005


def test_read_trace_from_path_skips_blank_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(line() + "\n\n" + line(timestamp=9, hash_ids=[0, 1, 3]) + "\n")
    reqs = read_trace(path)
    assert [r.timestamp_ms for r in reqs] == [5, 9]
    assert [r.line for r in reqs] == [1, 3]


def test_iter_trace_from_open_file():
    reqs = list(iter_trace(io.StringIO(line() + "\n")))
    assert reqs[0].hash_ids == (0, 1, 2)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        (json.dumps({"timestamp": 1, "input_length": 1, "output_length": 1}), "missing field(s) hash_ids"),
        (line(extra=1), "unknown field(s) extra"),
        (line(timestamp=True), "field 'timestamp' must be an integer, got True"),
        (line(timestamp=1.5), "field 'timestamp' must be an integer"),
        (line(input_length=-1), "field 'input_length' must be >= 0, got -1"),
        (line(output_length="7"), "field 'output_length' must be an integer"),
        (line(hash_ids=[]), "field 'hash_ids' must be a non-empty list"),
        (line(hash_ids="0 1 2"), "field 'hash_ids' must be a non-empty list"),
        (line(hash_ids=[0, "1", 2]), "hash_ids[1] must be an integer"),
        (line(hash_ids=[0, 1, 0]), "hash_ids repeats block 0"),
        (line(input_length=2000), "3 hash_ids for input_length 2000: expected ceil(2000/512) = 4"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line() + "\n" + text + "\n")
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert err.value.line == 2
    assert str(err.value).startswith(f"{path}:2: ")
    assert message in str(err.value)


def test_block_count_check_can_be_skipped():
    req = parse_line(line(input_length=99999), block_tokens=None)
    assert len(req.hash_ids) == 3


def test_prefix_inconsistency_names_both_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(line(hash_ids=[0, 1, 2]) + "\n" + line(hash_ids=[0, 5, 2]) + "\n")
    with pytest.raises(TraceError, match=r":2: block 2 follows 5 here but 1 on line 1"):
        read_trace(path)
    assert len(read_trace(path, check_prefixes=False)) == 2


def test_empty_trace_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(TraceError, match="no requests in trace"):
        read_trace(path)


def test_missing_file_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        read_trace(tmp_path / "nope.jsonl")


def test_write_then_read_round_trip(tmp_path):
    reqs = [TraceRequest(10, 600, 3, (7, 8)), TraceRequest(0, 10, 1, (7,))]
    path = tmp_path / "out.jsonl"
    assert write_trace(path, reqs) == 2
    back = read_trace(path)
    assert [(r.timestamp_ms, r.input_length, r.output_length, r.hash_ids) for r in back] == [
        (10, 600, 3, (7, 8)),
        (0, 10, 1, (7,)),
    ]
    assert [r.timestamp_ms for r in sorted_by_time(back)] == [0, 10]


@pytest.mark.skipif(not os.path.exists(REAL_TRACE), reason="the shared FAST'25 trace is not on this machine")
def test_real_trace_head_parses():
    with open(REAL_TRACE, encoding="utf-8") as fh:
        head = [next(fh) for _ in range(300)]
    reqs = read_trace(io.StringIO("".join(head)))
    assert len(reqs) == 300
    assert all(r.hash_ids[0] == 0 for r in reqs)
