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
    maintenance = _maintenance(ledger, store, enforcer, fake, reconcile_interval=3600.0, probe_interval=0)
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
    a poll when due and the signalled tenant's full reconcile — and no budget trim, even over a budget."""
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
    assert maintenance.signal_round(budgets, ["alpha"], now=6.0) == (0, 0) and ledger.table(ns).blocks == 7
    assert maintenance.signalled == {"alpha"}          # no trim here, and no reconcile while the trim waits


def test_a_signalled_tenant_over_its_budget_is_trimmed_before_it_is_reconciled():
    """A reconcile leases every block it finds for the master's lease (10 s), which would refuse the trim's removals
    (and the master then evicts at the quota instead): while a budget of the signalled tenant is still over after
    the round's trim, its reconcile waits; once the trim held the budget, it runs."""
    store, ns, ledger, connector, enforcer = make()
    size = connector.block_bytes
    hashes = put(connector, ns, list(range(1, 9)))
    fake = FakeMetrics()
    maintenance = _maintenance(ledger, store, enforcer, fake, reconcile_interval=3600.0, probe_interval=0)
    maintenance.last_reconcile = 0.0
    maintenance.tick([], ["alpha"], now=1.0)            # the baseline reading
    budgets = [Budget([ns.scope], 4 * size, "alpha")]
    leased = [k for h in hashes[4:] for k in ns.keys_for(h)]
    for key in leased:                                  # read leases: the trim is refused
        store.fail[key] = -706
    fake.text = metrics(1, {"alpha": size})
    counts = maintenance.tick(budgets, ["alpha"], now=5.0)
    assert counts["removed"] == 0 and counts["checked"] == 0 and maintenance.signalled == {"alpha"}
    for key in leased:                                  # the leases ran out: the trim goes, then the reconcile
        del store.fail[key]
    counts = maintenance.tick(budgets, ["alpha"], now=9.0)
    assert counts["removed"] > 0 and counts["checked"] == ledger.table(ns).blocks > 0
    assert not maintenance.signalled and maintenance.signal_reconciles == 1
