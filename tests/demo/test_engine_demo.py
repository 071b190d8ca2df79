"""Unit tests of the real-engine demo's logic (``demo.engine_scenario``, ``demo.engine_demo``, the form POST of
``demo.api``) that need no engine: conversation selection, prompts, request groups, predicted keys, orphans, the
registry it seeds (through the real REST API) and the command line."""
from __future__ import annotations

import pytest

from agent.contract import keys
from agent.datapath.hashing import VllmBlockHasher
from agent.datapath.keyspace import KeySpace
from agent.sim.trace import TraceRequest
from demo import cli, engine_scenario
from demo.api import _messages_block
from demo.engine_scenario import (
    BLOCK_TOKENS,
    GROUPS,
    EnginePorts,
    chain_parents,
    expected_store_hits,
    group_of,
    orphans,
    plan_requests,
    prompt_keys,
    select_conversations,
    shared_prefix_blocks,
)
from tests.support.registry import admin_api, fast_password_hashing, superuser  # noqa: F401 (fixtures)


def req(line: int, *ids: int, length: int | None = None) -> TraceRequest:
    return TraceRequest(timestamp_ms=line * 10, input_length=length or 512 * len(ids), output_length=1,
                        hash_ids=tuple(ids), line=line)


TRACE = [
    req(1, 0, 1, 2),          # conversation 1, turn 0
    req(2, 0, 10, 11),        # conversation 10: one turn only
    req(3, 0, 20),            # conversation 20, turn 0
    req(4, 0),                # one block: no conversation
    req(5, 0, 1, 2, 3),       # conversation 1, turn 1
    req(6, 0, 20, 21),        # conversation 20, turn 1
    req(7, 0, 1, 2, 3, 4),    # conversation 1, turn 2
    req(8, 0, 1, 2, 3, 4, 5),  # conversation 1, turn 3 (beyond TURNS=3)
]


def test_conversations_are_multi_turn_ordered_by_first_turn_and_cut_to_turns():
    picked = select_conversations(TRACE, conversations=5, turns=3)
    assert [[r.line for r in turns] for turns in picked] == [[1, 5, 7], [3, 6]]
    assert [[r.line for r in t] for t in select_conversations(TRACE, conversations=1, turns=2)] == [[1, 5]]
    for bad in ((0, 3), (1, 1)):
        with pytest.raises(ValueError):
            select_conversations(TRACE, *bad)


def test_plan_sends_first_turns_first_and_keeps_a_conversation_in_one_group():
    planned = plan_requests(select_conversations(TRACE, 5, 3), max_tokens=8)
    assert [(r.conversation, r.turn) for r in planned] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
    assert [r.phase for r in planned] == ["store", "store", "share", "share", "share"]
    for conversation in (0, 1):
        assert len({r.group for r in planned if r.conversation == conversation}) == 1
    assert all(r.group in GROUPS for r in planned)
    # later turns repeat the earlier turn's full blocks token for token
    first, later = planned[0].prompt, planned[2].prompt
    assert later[:3 * BLOCK_TOKENS] == first[:3 * BLOCK_TOKENS] and len(later) > len(first)
    assert all(len(r.prompt) <= 1024 - 8 for r in planned)
    # conversation 1: turn 1 shares 3 blocks with turn 0, turn 2 shares 4 with turn 1; conversation 20: 2 blocks
    assert shared_prefix_blocks(planned) == 3 + 4 + 2
    assert shared_prefix_blocks(planned, first_turns_only=True) == 3 + 3 + 2
    # node-b loads turn 1 of conversation 1 (3 blocks) and of conversation 20 (2 blocks, or 1 when both are in
    # one request group: block 0, the shared system prompt, is then in node-b's own cache); turn 2 of
    # conversation 1 finds its first 4 blocks in node-b's own cache and none of the rest in the Store
    one_group = planned[0].group == planned[1].group
    assert expected_store_hits(planned) == (3 + (1 if one_group else 2)) * BLOCK_TOKENS


def test_group_of_is_stable_and_uses_every_group():
    assert group_of(12345) == group_of(12345)
    assert {group_of(root) for root in range(50)} == set(GROUPS)


def test_predicted_keys_are_the_connector_keys_of_the_full_blocks():
    keyspace = KeySpace(tenant_id="acme", engine="vllm", served_model_name="tiny", vllm_model_name="tiny-llama",
                        namespace="tiny-2026-12", request_group="support-bot", cache_salt="salt-1",
                        hash_algo="sha256", block_size=32)
    prompt = list(range(100))  # 3 full blocks and a partial one, which is never stored
    expected = [keys.vllm_key("tiny-llama", digest, cache_prefix="tiny-2026-12")
                for digest in VllmBlockHasher("sha256", block_size=32, cache_salt="salt-1").block_hashes(prompt)]
    assert prompt_keys(keyspace, prompt) == expected and len(expected) == 3
    assert expected[0].startswith("tiny-2026-12@tiny-llama@tp_rank:0@")


def test_orphans_are_present_blocks_whose_parent_is_gone():
    parents = chain_parents([["a", "b", "c"], ["a", "b", "d"], ["x"]])
    assert parents == {"a": None, "b": "a", "c": "b", "d": "b", "x": None}
    assert orphans({"a", "b", "c", "d", "x"}, parents) == []
    assert orphans({"a", "c", "x"}, parents) == ["c"]
    assert orphans({"b"}, parents) == ["b"]
    assert orphans(set(), parents) == []


def test_ports_are_distinct():
    ports = EnginePorts.pick(lambda n: list(range(9000, 9000 + n)))
    assert ports.events == {"node-a": 9000, "node-b": 9001} and ports.api == {"a": 9004, "b": 9005, "c": 9006}
    with pytest.raises(ValueError, match="repeated"):
        EnginePorts.pick(lambda n: [9000] * n)


def test_command_line_picks_the_engine_and_keeps_the_simulator_default():
    args = cli.parse_args(["--once"])
    assert args.engine == "simulator" and args.requests == cli.ONCE_REQUESTS
    engine = cli.parse_args(["--engine", "vllm", "--once"])
    assert engine.engine == "vllm" and engine.requests is None  # the engine demo's own default
    assert cli.parse_args(["--engine", "vllm", "--requests", "4"]).requests == 4
    with pytest.raises(SystemExit):
        cli.parse_args(["--engine", "sglang"])


def test_form_messages_are_read_from_the_page():
    html = ('<main><ul class="messages">\n    <li class="error">Waiting for in-flight requests of '
            '&#x27;tiny-2026-12&#x27;</li>\n    <li class="success">Done.</li></ul><p>x</p></main>')
    block = _messages_block(html)
    assert 'class="error"' in block and "<p>" not in block
    assert _messages_block("<main>no messages</main>") == ""


class Rest:
    """``demo.api.RestClient``'s ``post`` and ``patch`` on Django's test client (the real API, its validation
    included)."""

    def __init__(self, client) -> None:
        self.client = client

    def post(self, path: str, body: dict) -> dict:
        if path == "tenants/":  # no master here: the pool's capacity is unknown, which needs a confirmation
            body = {**body, "confirm_overcommit": True}
        response = self.client.post(f"/api/v1/{path}", body, format="json")
        assert response.status_code == 201, (path, response.content)
        return response.json()

    def patch(self, path: str, body: dict) -> dict:
        response = self.client.patch(f"/api/v1/{path}", body, format="json")
        assert response.status_code == 200, (path, response.content)
        return response.json()


@pytest.mark.django_db
def test_seed_makes_a_valid_engine_registry(admin_api, tmp_path):  # noqa: F811 (fixture)
    from tenants.models import InstanceAssignment, Node, Release, RequestGroup

    ports = EnginePorts.pick(lambda n: list(range(9100, 9100 + n)))
    api = Rest(admin_api)
    dep = engine_scenario.seed(api, engine_scenario.seed_nodes(api, ports), ports, tmp_path / "tiny-llama")
    release = Release.objects.get(namespace=engine_scenario.OLD_NAMESPACE)
    assert release.state == "serving" and release.block_size == 32 and release.engine == "vllm"
    assert set(RequestGroup.objects.values_list("name", flat=True)) >= set(GROUPS)
    assert all(dep.group_salts[g] for g in GROUPS) and len(set(dep.group_salts.values())) == 2
    for node in Node.objects.all():
        assert node.store_mode == "standalone-store" and node.store_segment_bytes == engine_scenario.SEGMENT_BYTES
        assert node.kv_events_port == ports.events[node.name]
        assert node.model_roots == [str(tmp_path)]  # the directory the model is loaded from
    assignments = InstanceAssignment.objects.order_by("port")
    assert [(a.node.name, a.port) for a in assignments] == [("node-a", 9104), ("node-b", 9105)]
    assert dep.instances["a"] == ("node-a", engine_scenario.OLD_NAMESPACE, str(assignments[0].pk))
    copy = admin_api.post(f"/api/v1/releases/{release.pk}/copy/", {"namespace": engine_scenario.NEW_NAMESPACE},
                          format="json")
    assert copy.status_code == 201, copy.content
    instance = engine_scenario.assign_new_release(api, dep, ports, copy.json()["id"])
    assert dep.instances["c"] == ("node-a", engine_scenario.NEW_NAMESPACE, instance)


@pytest.mark.integration
def test_store_probe_answers_which_keys_the_tenant_holds(mooncake_master, store_client_factory, unique_name,
                                                          tmp_path):
    import ctypes
    import json
    import subprocess
    import sys

    from demo.procs import ROOT

    client = store_client_factory(mooncake_master, "alpha", "engine-demo-probe")
    buffer = ctypes.create_string_buffer(4096)
    client.register(ctypes.addressof(buffer), 4096)
    try:
        prefix = unique_name("probe")
        held = [f"{prefix}@a", f"{prefix}@b"]
        assert client.put_from(held, [ctypes.addressof(buffer)] * 2, [4096, 4096]) == [0, 0]
    finally:
        client.unregister(ctypes.addressof(buffer))
    keys = [held[0], f"{prefix}@never-stored", held[1]]

    def probe(tenant: str) -> list[int]:
        path = tmp_path / f"{tenant}.json"
        path.write_text(json.dumps({"store": mooncake_master.endpoints().model_dump(), "tenant_id": tenant,
                                    "keys": keys}))
        done = subprocess.run([sys.executable, "-m", "demo.store_probe", str(path)], cwd=ROOT, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])["exists"]

    assert probe("alpha") == [1, 0, 1]
    assert probe("beta") == [0, 0, 0]  # keys are per tenant


def _engine_demo(tmp_path):
    from demo.engine_demo import EngineDemo

    return EngineDemo(cli.parse_args(["--engine", "vllm", "--var-dir", str(tmp_path / "demo")]))


def test_cross_group_keys_leave_out_blocks_both_groups_sent(tmp_path):
    demo = _engine_demo(tmp_path)
    spaces = {group: KeySpace(tenant_id="acme", engine="vllm", served_model_name="tiny", vllm_model_name="tiny-llama",
                              namespace="ns", request_group=group, cache_salt=f"salt-{group}", block_size=32)
              for group in GROUPS}
    demo.keyspaces = {("ns", group): space for group, space in spaces.items()}
    system = list(range(32))  # a block both groups sent (the trace's shared system prompt)
    a_only, b_only = system + [1] * 64, system + [2] * 32
    demo.sent = {("ns", GROUPS[0]): [tuple(a_only)], ("ns", GROUPS[1]): [tuple(b_only)]}
    cross = demo.cross_group_keys("ns", GROUPS)
    # under group 0's salt: b's 2 blocks minus the shared one -> 1; under group 1's salt: a's 3 minus 1 -> 2
    assert len(cross) == 3
    assert not set(cross) & set(prompt_keys(spaces[GROUPS[0]], a_only))
    assert not set(cross) & set(prompt_keys(spaces[GROUPS[1]], b_only))
    predicted = demo.predicted_keys()
    assert len(predicted[("ns", GROUPS[0])]) == 3 and len(predicted[("ns", GROUPS[1])]) == 2
    assert not set(predicted[("ns", GROUPS[0])]) & set(predicted[("ns", GROUPS[1])])  # salts: nothing shared


def test_checks_page_verdicts_are_read_by_key(tmp_path):
    from demo.engine_demo import EngineDemo

    page = {"blocks_registered": {"key": "blocks_registered", "title": "Every stored block belongs to a registered "
                                  "request group", "status": "fail", "summary": "1 source",
                                  "details": ["instance 3: 4 Store block(s) with a cache_salt of no group"]}}
    passed, text = EngineDemo.verdict_text(page, "blocks_registered")
    assert not passed and "fail: 1 source (instance 3: 4 Store block(s)" in text
    assert EngineDemo.verdict_text(page, "engines_hash_registered") == (
        False, "the Checks page has no check 'engines_hash_registered'")


def test_full_pool_prompts_fill_the_room_with_documents_and_their_continuations():
    from demo.engine import MAX_MODEL_LEN

    room = 2 << 20
    requests = engine_scenario.full_pool_prompts(room, 3, continuations=3)
    blocks = {tuple(prompt[i:i + engine_scenario.BLOCK_TOKENS])
              for _, prompt in requests for i in range(0, len(prompt) - 31, engine_scenario.BLOCK_TOKENS)}
    assert len(blocks) * engine_scenario.BLOCK_BYTES >= 3 * room
    assert all(len(p) + engine_scenario.MAX_TOKENS <= MAX_MODEL_LEN for _, p in requests)
    first, second, third, fourth = (p for _, p in requests[:4])
    prefix = 16 * engine_scenario.BLOCK_TOKENS
    assert first[:prefix] == second[:prefix] == third[:prefix] != fourth[:prefix]  # one document, 3 continuations
    assert first[prefix:] != second[prefix:]
    assert {g for g, _ in requests} == set(engine_scenario.GROUPS)
    with pytest.raises(ValueError, match="model length"):
        engine_scenario.full_pool_prompts(room, prefix_blocks=20, continuation_blocks=20)
