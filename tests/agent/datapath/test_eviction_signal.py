"""The master's eviction counters as a signal (``agent.datapath.eviction_signal``) and the node-maintenance policy
acting on it (``Maintenance``: a full reconcile of the signalled tenant at once, at most once per ``signal_gap``),
with a fake metrics source; the bounded HTTP read against a local server. The same against a real master:
``test_eviction_signal_integration.py``."""
from __future__ import annotations

import http.server
import threading
import time

import pytest

from agent.datapath.eviction_signal import (
    EvictionWatch,
    MetricsError,
    parse_eviction_counters,
    read_metrics,
)
from agent.datapath.maintenance import Budget, Maintenance
from tests.agent.datapath.test_budget_unit import make, put


def metrics(evicted_keys: int = 0, tenants: dict[str, int] | None = None) -> str:
    lines = ["# HELP master_evicted_key_count evicted keys", "# TYPE master_evicted_key_count gauge",
             f"master_evicted_key_count {evicted_keys}", f"master_evicted_size_bytes {evicted_keys * 1024}",
             f"master_successful_evictions_total {evicted_keys // 4}", "master_key_count 12",
             'mooncake_tenant_quota_charged_bytes{tenant_id="alpha"} 4096']
    for tenant, value in (tenants or {}).items():
        lines.append(f'mooncake_tenant_evict_bytes_total{{tenant_id="{tenant}"}} {value}')
    return "\n".join(lines) + "\n"


class FakeMetrics:
    """``url -> text`` of a fake master; ``fail`` makes the next reads raise."""

    def __init__(self) -> None:
        self.text = metrics()
        self.fail = False
        self.reads = 0

    def __call__(self, url: str) -> str:
        self.reads += 1
        if self.fail:
            raise MetricsError(f"{url}: connection refused")
        return self.text


def test_parse_reads_global_and_per_tenant_counters_only():
    counters = parse_eviction_counters(metrics(8, {"alpha": 4096, "beta": 0}))
    assert counters.totals == {"master_evicted_key_count": 8.0, "master_evicted_size_bytes": 8192.0,
                               "master_successful_evictions_total": 2.0}
    assert counters.tenants == {"alpha": 4096.0, "beta": 0.0}
    with pytest.raises(MetricsError):
        parse_eviction_counters("<html>not a master</html>\nsome_metric 1\n")


def test_watch_signals_the_tenant_whose_counter_grew_else_every_tenant():
    fake = FakeMetrics()
    watch = EvictionWatch(["http://m/metrics"], fetch=fake)
    fake.text = metrics(0, {"alpha": 0})
    assert not watch.poll(0.0)                          # the first reading is the baseline
    assert not watch.poll(1.0)
    fake.text = metrics(4, {"alpha": 4096, "beta": 0})
    signal = watch.poll(2.0)
    assert signal.tenants == {"alpha"} and not signal.every_tenant
    assert signal.affected(["alpha", "beta"]) == ["alpha"]
    fake.text = metrics(4, {"alpha": 4096, "beta": 0, "gamma": 1})  # a tenant first seen above 0 grew from 0
    assert watch.poll(3.0).tenants == {"gamma"}
    fake.text = metrics(9, {"alpha": 4096, "beta": 0, "gamma": 1})  # only a global counter grew
    assert watch.poll(4.0).every_tenant
    fake.text = metrics(0, {})                                      # the master restarted: counters from 0
    assert watch.poll(5.0).every_tenant
    assert not watch.poll(6.0)
    assert watch.signals == 4 and watch.polls == 7


def test_a_failing_url_backs_off_keeps_its_baseline_and_reports_the_error():
    fake = FakeMetrics()
    watch = EvictionWatch(["http://m/metrics"], fetch=fake, poll_interval=1.0)
    watch.poll(0.0)
    fake.fail = True
    assert not watch.poll(1.0) and "connection refused" in watch.last_error and fake.reads == 2
    assert not watch.poll(2.0) and fake.reads == 2      # backing off: not read
    fake.fail = False
    fake.text = metrics(4, {"alpha": 10})
    assert watch.poll(12.0).tenants == {"alpha"} and watch.last_error == ""  # compared with the old baseline
    assert watch.due(12.5) is False and watch.due(13.0) is True
    assert not EvictionWatch().due(0.0)                 # no URL: nothing to poll


def _maintenance(ledger, store, enforcer, fake, **kwargs):
    maintenance = Maintenance("node-a", ledger, enforcer, lambda tenant: store,
                              eviction_watch=EvictionWatch(fetch=fake), signal_gap=3.0, **kwargs)
    maintenance.set_master_metrics(["http://master:9003/metrics"])
    return maintenance


def test_an_eviction_signal_reconciles_the_tenant_at_once_not_at_the_interval():
    store, ns, ledger, connector, enforcer = make()
    hashes = put(connector, ns, list(range(1, 13)))
    fake = FakeMetrics()
    maintenance = _maintenance(ledger, store, enforcer, fake, reconcile_interval=3600.0, probe_interval=0)
    maintenance.last_reconcile = 0.0                    # the last scheduled reconcile: an hour until the next
    assert maintenance.tick([], ["alpha"], now=1.0)["checked"] == 0  # baseline reading, no signal
    for h in hashes[8:]:                                # the master evicts the last 4 blocks
        for key in ns.keys_for(h):
            del store.objects[key]
    fake.text = metrics(4, {"alpha": 4 * 1024})
    counts = maintenance.tick([], ["alpha"], now=2.0)   # the next round: every block of the tenant checked
    assert counts == {"checked": 12, "missing": 4, "removed": 0, "orphans_removed": 0}
    table = ledger.table(ns)
    assert (table.blocks, table.master_evicted_blocks, maintenance.signal_reconciles) == (8, 4, 1)
    assert ledger.snapshot()[0]["store_evicted_blocks"] == 4


def test_signalled_reconciles_are_lease_aware_once_per_gap_and_only_on_a_signal():
    store, ns, ledger, connector, enforcer = make()
    put(connector, ns, list(range(1, 9)))
    fake = FakeMetrics()
    # lease_ttl 0: every reconcile checks every block (the leases of its own checks: the test after the next)
    maintenance = _maintenance(ledger, store, enforcer, fake, reconcile_interval=3600.0, probe_interval=0,
                               lease_ttl=0)
    maintenance.last_reconcile = 0.0
    checked = []
    for step in range(1, 11):                           # no eviction: nothing is checked (no lease taken)
        checked.append(maintenance.tick([], ["alpha"], now=float(step))["checked"])
    assert checked == [0] * 10 and fake.reads == 10
    fake.text = metrics(4, {"alpha": 1})
    assert maintenance.tick([], ["alpha"], now=11.0)["checked"] == 8
    fake.text = metrics(8, {"alpha": 2})                # another round 1 s later: waits for the gap
    assert maintenance.tick([], ["alpha"], now=12.0)["checked"] == 0 and maintenance.signalled == {"alpha"}
    assert maintenance.tick([], ["alpha"], now=13.0)["checked"] == 0
    assert maintenance.tick([], ["alpha"], now=14.0)["checked"] == 8 and not maintenance.signalled
    fake.text = metrics(12, {"beta": 5})                # another tenant's eviction: alpha is not checked
    assert maintenance.tick([], ["alpha"], now=20.0)["checked"] == 0
    assert maintenance.signal_reconciles == 2


def test_no_urls_no_polling_and_the_document_names_them():
    from agent.contract.messages import NodeSettings

    store, ns, ledger, connector, enforcer = make()
    fake = FakeMetrics()
    maintenance = Maintenance("node-a", ledger, enforcer, lambda tenant: store,
                              eviction_watch=EvictionWatch(fetch=fake))
    maintenance.tick([], ["alpha"], now=1.0)
    assert fake.reads == 0 and not maintenance.signal_due(2.0)
    settings = NodeSettings(kv_events_port=5557, master_metrics_urls=("http://127.0.0.1:9003/metrics",))
    maintenance.set_master_metrics(settings.master_metrics_urls)
    assert maintenance.signal_due(2.0)
    assert NodeSettings(kv_events_port=5557).master_metrics_urls == ()  # documents of older dashboards
    with pytest.raises(ValueError):
        NodeSettings(kv_events_port=5557, master_metrics_urls=("file:///etc/passwd",))


#: Set when ``/drip-headers`` has sent its whole response.
DRIPPED = threading.Event()


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/drip-headers":  # a local process on the master's port: headers a byte every 0.05 s, 10 s
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Drip: ")
            for _ in range(200):
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.05)
            body = metrics(3, {"alpha": 7}).encode()
            try:
                self.wfile.write(b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            except OSError:
                pass
            finally:
                DRIPPED.set()
            self.close_connection = True
            return
        self.send_response(200)
        if self.path == "/slow":
            self.end_headers()
            for _ in range(50):                         # drips a line every 0.1 s: 5 s in all
                try:
                    self.wfile.write(b"master_key_count 1\n")
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.1)
        elif self.path == "/big":
            self.end_headers()
            try:
                self.wfile.write(b"x" * (1 << 20))
            except OSError:
                return
        else:
            body = metrics(3, {"alpha": 7}).encode()
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_read_metrics_is_bounded_in_time_and_size(server):
    assert parse_eviction_counters(read_metrics(server + "/metrics")).tenants == {"alpha": 7.0}
    with pytest.raises(MetricsError, match="slower than"):
        read_metrics(server + "/slow", deadline=0.5)    # a body that never ends within the deadline
    with pytest.raises(MetricsError, match="over"):
        read_metrics(server + "/big", max_bytes=64 << 10)
    with pytest.raises(MetricsError):
        read_metrics("http://127.0.0.1:1/metrics")
    with pytest.raises(MetricsError, match="not an http"):
        read_metrics("file:///etc/passwd")


def test_read_metrics_bounds_the_headers_too(server):
    """Headers that never end within the deadline (each byte well within a socket timeout) are over it too: the
    maintenance round that polls (under the engines' tick lock) is not held while a spoofed endpoint drips them."""
    DRIPPED.clear()
    with pytest.raises(MetricsError, match="slower than"):
        read_metrics(server + "/drip-headers", deadline=0.5)
    assert not DRIPPED.is_set()  # gave up while the headers were still dripping, not once they ended


def test_a_light_signal_round_reconciles_between_full_rounds_and_trims_nothing():
    """``Maintenance.signal_round`` (the real-engine agent's round between its 2 s ticks): only the eviction signal —
    a poll when due and the signalled tenant's reconcile — and no budget trim, even over a budget."""
    store, ns, ledger, connector, enforcer = make()
    size = connector.block_bytes
    hashes = put(connector, ns, list(range(1, 9)))
    fake = FakeMetrics()
    maintenance = _maintenance(ledger, store, enforcer, fake, reconcile_interval=3600.0, probe_interval=0)
    maintenance.last_reconcile = 0.0
    assert maintenance.signal_round([], ["alpha"], now=1.0) == (0, 0) and fake.reads == 1  # the baseline
    assert maintenance.signal_round([], ["alpha"], now=1.5) == (0, 0) and fake.reads == 1  # not due yet (1 s)
    for key in ns.keys_for(hashes[-1]):                 # the master evicts the last block
        del store.objects[key]
    fake.text = metrics(1, {"alpha": size})
    assert maintenance.signal_round([], ["alpha"], now=2.0) == (8, 1)
    assert ledger.table(ns).blocks == 7 and maintenance.signal_reconciles == 1
    fake.text = metrics(2, {"alpha": 2 * size})        # another eviction; the tenant is over a budget now
    budgets = [Budget([ns.scope], 2 * size, "alpha")]
    maintenance.signal_round(budgets, ["alpha"], now=6.0)
    assert ledger.table(ns).blocks == 7 and maintenance.removed_over_budget == 0  # no trim in a light round


class Clock:
    """A ledger clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _checked_keys(store):
    """Record the keys each ``exists`` call of ``store`` asks about (a list per call)."""
    calls: list[list[str]] = []
    real = store.exists

    def exists(keys):
        calls.append(list(keys))
        return real(keys)

    store.exists = exists
    return calls


def test_a_block_this_node_checked_is_not_checked_again_within_the_lease():
    """A check leases what it finds for the master's --default_kv_lease_ttl: the master cannot evict those blocks
    until it ends, so a reconcile on the next signal leaves them out (a check would only lengthen the lease), and
    checks them again once ``lease_ttl - LEASE_MARGIN`` passed. After a master restart (a counter went down) every
    block is checked: leased or not, every object went."""
    from agent.datapath.maintenance import LEASE_MARGIN

    store, ns, ledger, connector, enforcer = make()
    clock = Clock()
    ledger.clock = clock
    hashes = put(connector, ns, list(range(1, 9)))
    fake = FakeMetrics()
    maintenance = _maintenance(ledger, store, enforcer, fake, reconcile_interval=3600.0, probe_interval=0,
                               lease_ttl=10.0)
    maintenance.last_reconcile = 0.0
    calls = _checked_keys(store)
    maintenance.tick([], ["alpha"], now=1.0)            # the baseline reading
    fake.text = metrics(1, {"alpha": 1})
    assert maintenance.tick([], ["alpha"], now=2.0)["checked"] == 8  # a connector's put leases nothing: all
    clock.now += 4.0
    put(connector, ns, [1, 2, 3, 4, 50, 51])            # two blocks more, not checked yet
    fake.text = metrics(2, {"alpha": 2})
    assert maintenance.tick([], ["alpha"], now=6.0)["checked"] == 2  # the 8 are still under this node's lease
    assert set(calls[-1]) == {k for h in ns.trace_hashes([1, 2, 3, 4, 50, 51])[4:] for k in ns.keys_for(h)}
    clock.now += 10.0 - LEASE_MARGIN - 4.0              # the first check's lease is about to end: checked again
    for key in ns.keys_for(hashes[-1]):                 # the master evicts a block whose lease ended
        del store.objects[key]
    fake.text = metrics(3, {"alpha": 3})
    assert maintenance.tick([], ["alpha"], now=10.0) == {"checked": 8, "missing": 1, "removed": 0,
                                                         "orphans_removed": 0}
    store.objects.clear()                               # the master restarted: its counters start again from 0
    fake.text = metrics(0, {})
    assert maintenance.tick([], ["alpha"], now=14.0)["missing"] == 9 and ledger.table(ns).blocks == 0


def test_engine_writes_confirmed_by_a_check_are_under_its_lease():
    """``record_put(checked=True)`` (an engine write the agent's ``batch_is_exist`` confirmed) stamps the block as
    leased now; a lease-aware reconcile leaves it out until ``leased_for`` passed, a plain one does not."""
    from agent.datapath.ledger import Outcome

    store, ns, ledger, connector, enforcer = make()
    clock = Clock()
    ledger.clock = clock
    hashes = ns.trace_hashes([1, 2, 3])
    for h in hashes:
        for key in ns.keys_for(h):
            store.objects[key] = b"x"
    ledger.record_put(ns, hashes[:2], None, [Outcome.STORED] * 2, 256, checked=True)
    ledger.record_put(ns, hashes[2:], hashes[1], [Outcome.STORED], 256)
    assert ledger.reconcile(store, sample=None, leased_for=9.0).checked == 1
    assert ledger.reconcile(store, sample=None).checked == 3
    assert ledger.recent_bytes([ns.scope], 10.0) == 3 * 256  # what was booked lately: the trims' coming work
    clock.now += 9.0
    assert ledger.reconcile(store, sample=None, leased_for=9.0).checked == 3
    clock.now += 1.0
    assert ledger.recent_bytes([ns.scope], 10.0) == 0


def test_a_signalled_tenant_over_its_budget_is_reconciled_at_once_but_for_the_trims_next_victims():
    """A reconcile leases every block it finds for the master's lease (10 s), which would refuse the trim's coming
    removals while the master, which ignores budgets, evicts at the quota instead. So a signalled tenant with a
    budget is reconciled at once, but its trim's next victims (``BudgetEnforcer.next_victims``: down to the low-water
    mark and the bytes written in the last lease further) are left out: the trim's removal says whether those are
    gone (-704: the ledger forgets them), without a lease."""
    from agent.datapath.maintenance import BUDGET_LOW_WATER

    store, ns, ledger, connector, enforcer = make()
    clock = Clock()
    ledger.clock = clock
    size = connector.block_bytes
    for start in (10, 20, 30, 40):                      # four chains of 4 blocks, 16 blocks, written long ago
        put(connector, ns, list(range(start, start + 4)))
        clock.now += 1.0
    clock.now += 60.0
    fake = FakeMetrics()
    maintenance = _maintenance(ledger, store, enforcer, fake, reconcile_interval=3600.0, probe_interval=0)
    maintenance.last_reconcile = 0.0
    maintenance.tick([], ["alpha"], now=1.0)            # the baseline reading
    budgets = [Budget([ns.scope], 14 * size, "alpha")]
    victims = enforcer.next_victims([ns.scope], 14 * size, low_water=BUDGET_LOW_WATER)
    assert len(victims) == 3 and ledger.table(ns).blocks == 16  # a plan only: nothing removed
    leased = [k for key in victims for k in ns.keys_for(ledger.table(ns).get(key).block_hash)]
    for key in list(store.objects):                     # read leases of the engines: every removal is refused
        store.fail[key] = -706
    keep = [e for e in ledger.table(ns).owned_present() if e.key not in victims]
    for key in ns.keys_for(keep[0].block_hash):         # the master evicted a block the trim does not want
        del store.objects[key]
    calls = _checked_keys(store)
    fake.text = metrics(1, {"alpha": size})
    counts = maintenance.tick(budgets, ["alpha"], now=5.0)
    assert counts["removed"] == 0 and maintenance.signal_reconciles == 1 and not maintenance.signalled
    assert counts["checked"] == 13 and counts["missing"] == 1     # at once, all but the trim's next victims
    assert not {k for c in calls for k in c} & set(leased)        # which no check leased
    assert ledger.table(ns).blocks == 15
    victim = next(e for k in sorted(victims) if (e := ledger.table(ns).get(k)).children_count == 0)
    for key in ns.keys_for(victim.block_hash):          # the master evicts a victim: the trim's removal finds it
        store.fail.pop(key)
        del store.objects[key]
    before = len(calls)
    maintenance.enforce_budgets(budgets)
    assert ledger.table(ns).get(victim.key) is None or not ledger.table(ns).get(victim.key).present
    assert len(calls) == before                         # no existence check: the removal's -704 said it
