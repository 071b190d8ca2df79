"""Django system checks of the control plane's settings (``manage.py check``; also run before ``runserver``,
``migrate`` and the other commands that check).

``dashboard/env.py`` refuses malformed environment values when the settings load; these checks look at the
*settings* as Django ended up with them (a settings module that sets values directly, a derived settings
module such as ``demo.settings``, ``override_settings``) and at relations between settings that no single
parser can see. Errors (``kvpool.E…``) stop the commands that check; warnings (``kvpool.W…``) are printed.

=============  ===========================================================================================
``E001``       a ``KVPOOL_*`` duration, size, request limit or registry cap is missing or not an integer
``E002``       a ``KVPOOL_*`` duration, size, request limit or registry cap is below its minimum (seconds
               positive, sizes non-negative, request bodies at least 64 KiB, JSON depth at least 8, instance
               and request group caps at least 1)
``E003``       rollup ages not increasing: raw-after < minute-after < retention
``E004``       ``CELERY_BROKER_URL`` is not a ``redis://``/``rediss://`` URL with a host and a numeric database
``E005``       ``KVPOOL_MASTER_ADMIN_URL`` is not ``http(s)://host:port`` (no path, query or fragment)
``E006``       ``KVPOOL_MASTER_ADDRESS`` is not ``host:port``
``E007``       ``KVPOOL_METADATA_SERVER`` is empty, or an ``http(s)://`` URL without host and port
``E008``       ``KVPOOL_STORE_PROTOCOL`` is not a non-empty string, or ``KVPOOL_STORE_DEVICE`` not a string
``E009``       ``KVPOOL_ENGINE_CONFIG_DIR`` is not an absolute path
``E010``       ``KVPOOL_TENANT_QUOTAS_PATH`` is not a non-empty path
``E011``       ``KVPOOL_MASTER_SYNC`` is not a boolean
``E012``       ``KVPOOL_METRICS_TOKEN`` is not a string, or holds whitespace (unusable in a Bearer header)
``E013``       a Celery beat period or the broker's ``visibility_timeout`` is not a positive number
``E014``       ``SECRET_KEY`` is empty or the development key while ``DEBUG`` is off
``E015``       ``SECURE_PROXY_SSL_HEADER`` is not ``("HTTP_<HEADER>", "<value>")``
``E016``       the HA master settings (``KVPOOL_MASTER_HA_*``) do not make an HA set (``tenants.masters``)
``W001``       ``KVPOOL_STORE_PROTOCOL`` is neither ``tcp`` nor ``rdma``
``W002``       ``KVPOOL_PUSH_EXPIRES_SECONDS`` < ``KVPOOL_REPUSH_AFTER_SECONDS``
``W003``       ``KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS`` > ``KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS``
``W004``       ``KVPOOL_HEARTBEAT_SILENCE_SECONDS`` shorter than two agent heartbeats
``W005``       ``KVPOOL_METRICS_WINDOW_SECONDS`` shorter than two agent reports
``W006``       ``KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS`` not shorter than the master sampling period
``W007``       ``KVPOOL_METADATA_SERVER`` is none of the forms Mooncake documents
``W009``       HA mode with one master only, or with an ``http(s)://`` metadata server (a master's embedded one dies
               with it; HA clients use the etcd endpoints or ``P2PHANDSHAKE``)
``W008``       (``check --deploy`` only) ``KVPOOL_METRICS_TOKEN`` is empty while ``DEBUG`` is off: ``/metrics`` is
               open to anyone who reaches the dashboard, and its gauges name every tenant
=============  ===========================================================================================

The settings module holds no ratio settings today; a new one belongs in ``_RATIOS`` (checked to lie in (0, 1]).
"""
from __future__ import annotations

import argparse
import math
import posixpath
from collections.abc import Callable
from typing import Any, TypeGuard
from urllib.parse import urlsplit

from django.conf import settings
from django.core import checks

TAG = "kvpool"

#: Integer settings and their least allowed value (the same minimums ``dashboard/settings.py`` passes to
#: ``env_int``, except the Store sizes: 0 is what Mooncake takes for "mount nothing", and the demo's small
#: segments are set below the environment parser's floor on purpose).
_INTEGERS: dict[str, int] = {
    "KVPOOL_REPUSH_AFTER_SECONDS": 1,
    "KVPOOL_PUSH_EXPIRES_SECONDS": 1,
    "KVPOOL_ROLLUP_RAW_AFTER_SECONDS": 60,
    "KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS": 3600,
    "KVPOOL_RETENTION_SECONDS": 3600,
    "KVPOOL_MASTER_SAMPLE_RETENTION_SECONDS": 60,
    "KVPOOL_CHARGEBACK_MAX_GAP_SECONDS": 1,
    "KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS": 1,
    "KVPOOL_METRICS_WINDOW_SECONDS": 1,
    "KVPOOL_HEARTBEAT_SILENCE_SECONDS": 1,
    "KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS": 60,
    "KVPOOL_AGENT_CLOCK_SKEW_SECONDS": 0,
    "KVPOOL_GLOBAL_SEGMENT_SIZE": 0,
    "KVPOOL_LOCAL_BUFFER_SIZE": 0,
    "KVPOOL_MAX_REQUEST_BYTES": 64 << 10,
    "KVPOOL_MAX_JSON_DEPTH": 8,
    "KVPOOL_MAX_INSTANCES_PER_NODE": 1,
    "KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE": 1,
    "KVPOOL_MAX_INSTANCES_PER_TENANT": 1,
    "KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT": 1,
    "KVPOOL_MASTER_FAILOVER_FLAG_SECONDS": 1,
}

#: Unit of each integer setting in messages, by the end of its name (seconds otherwise).
_UNITS = {"_SIZE": "bytes", "_BYTES": "bytes", "_DEPTH": "levels", "_GROUPS_PER_TENANT": "request groups",
          "_NODE": "instances", "_TENANT": "instances"}

#: Ratio settings (checked to lie in (0, 1]); none today.
_RATIOS: tuple[str, ...] = ()

#: Defaults of ``kvpool-agent run --heartbeat-interval`` / ``--report-interval`` (seconds).
AGENT_HEARTBEAT_INTERVAL = 5
AGENT_REPORT_INTERVAL = 10

#: Store protocols the rendered Mooncake client configs are meant for.
KNOWN_PROTOCOLS = ("tcp", "rdma")


def _hint_env(name: str, example: Any) -> str:
    return f"Set the environment variable {name} (e.g. {name}={example}) or the setting in your settings module."


def _is_number(value: Any) -> TypeGuard[int | float]:
    """An ``int`` or ``float`` (``bool`` is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(name: str) -> int | None:
    """The setting's value when it is an integer (``bool`` is not), else ``None``."""
    value = getattr(settings, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@checks.register(TAG)
def check_integer_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """E001/E002: every duration (seconds), Store size (bytes) and request limit (bytes, JSON levels) is an
    integer at or above its minimum;
    ratios (none today) lie in (0, 1]."""
    errors: list[checks.CheckMessage] = []
    for name, minimum in _INTEGERS.items():
        value = _integer(name)
        if value is None:
            errors.append(checks.Error(
                f"{name} must be an integer, not {getattr(settings, name, None)!r}.",
                hint=_hint_env(name, max(minimum, 1) * 60), obj=name, id="kvpool.E001"))
        elif value < minimum:
            unit = next((unit for suffix, unit in _UNITS.items() if name.endswith(suffix)), "seconds")
            errors.append(checks.Error(
                f"{name}={value} is below its minimum of {minimum} {unit}.",
                hint=f"Use at least {minimum} {unit}.", obj=name, id="kvpool.E002"))
    for name in _RATIOS:
        ratio = getattr(settings, name, None)
        if not _is_number(ratio) or not 0 < ratio <= 1:
            errors.append(checks.Error(f"{name} must be a ratio in (0, 1], not {ratio!r}.",
                                       hint="Use a fraction such as 0.9.", obj=name, id="kvpool.E002"))
    return errors


@checks.register(TAG)
def check_rollup_ages(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """E003: raw samples roll up into minutes, minutes into hours, hours are deleted: the ages must grow."""
    names = ("KVPOOL_ROLLUP_RAW_AFTER_SECONDS", "KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS", "KVPOOL_RETENTION_SECONDS")
    raw, minute, retention = (_integer(name) for name in names)
    if raw is None or minute is None or retention is None:
        return []  # E001 says so
    if raw < minute < retention:
        return []
    return [checks.Error(
        f"Rollup ages must increase: KVPOOL_ROLLUP_RAW_AFTER_SECONDS ({raw}) < "
        f"KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS ({minute}) < KVPOOL_RETENTION_SECONDS ({retention}).",
        hint="Raw samples become 1-minute rows after the first age, 1-minute rows become 1-hour rows after the "
             "second, 1-hour rows are deleted after the retention; a later stage must not start before an "
             "earlier one (defaults: 3600 < 172800 < 7776000).",
        obj="KVPOOL_RETENTION_SECONDS", id="kvpool.E003")]


@checks.register(TAG)
def check_broker(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """E004: the broker URL is one the dashboard and the agents can both use (``agent.contract.broker``);
    E013: beat periods and the broker's visibility timeout are positive numbers."""
    from agent.contract.broker import broker_url

    errors: list[checks.CheckMessage] = []
    url = getattr(settings, "CELERY_BROKER_URL", None)
    try:
        if not isinstance(url, str):
            raise argparse.ArgumentTypeError(f"{url!r} is not a string")
        broker_url(url, schemes=("redis", "rediss"))
    except argparse.ArgumentTypeError as exc:
        errors.append(checks.Error(f"CELERY_BROKER_URL: {exc}.", hint=_hint_env("CELERY_BROKER_URL",
                                                                                "redis://127.0.0.1:6379/0"),
                                   obj="CELERY_BROKER_URL", id="kvpool.E004"))

    def positive(value: Any) -> bool:
        return _is_number(value) and math.isfinite(value) and value > 0

    for entry, spec in (getattr(settings, "CELERY_BEAT_SCHEDULE", None) or {}).items():
        period = spec.get("schedule") if isinstance(spec, dict) else None
        if _is_number(period) and not positive(period):  # schedule objects (crontab) are Celery's business
            errors.append(checks.Error(
                f"CELERY_BEAT_SCHEDULE[{entry!r}] runs every {period!r} seconds.",
                hint="Periods are positive seconds (KVPOOL_RECONCILE_SECONDS, KVPOOL_ROLLUP_SECONDS, "
                     "KVPOOL_MASTER_SYNC_SECONDS, KVPOOL_MASTER_SAMPLE_SECONDS).",
                obj="CELERY_BEAT_SCHEDULE", id="kvpool.E013"))
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {}
    if "visibility_timeout" in options and not positive(options["visibility_timeout"]):
        errors.append(checks.Error(
            f"CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout'] is {options['visibility_timeout']!r}.",
            hint=_hint_env("KVPOOL_BROKER_VISIBILITY_TIMEOUT", 3600), obj="CELERY_BROKER_TRANSPORT_OPTIONS",
            id="kvpool.E013"))
    return errors


def _url_problem(value: Any, schemes: tuple[str, ...]) -> str | None:
    """Why ``value`` is not ``scheme://host:port`` with one of ``schemes`` and nothing after the port."""
    if not isinstance(value, str) or not value:
        return f"{value!r} is not a URL"
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        return f"{value!r} is not a valid URL ({exc})"
    if parts.scheme.lower() not in schemes:
        return f"{value!r} does not start with {' or '.join(s + '://' for s in schemes)}"
    if not parts.hostname:
        return f"{value!r} names no host"
    if port is None:
        return f"{value!r} names no port"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"{value!r} has a path, query or fragment after the port"
    return None


@checks.register(TAG)
def check_master_endpoints(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """E005–E008, W001, W007: the Mooncake master's admin URL, RPC address, metadata server and protocol."""
    errors: list[checks.CheckMessage] = []
    admin = getattr(settings, "KVPOOL_MASTER_ADMIN_URL", None)
    problem = _url_problem(admin, ("http", "https"))
    if problem:
        errors.append(checks.Error(
            f"KVPOOL_MASTER_ADMIN_URL: {problem}.",
            hint="The base of the master's metrics/admin HTTP server (mooncake_master --metrics_port), "
                 "e.g. http://127.0.0.1:9003; the dashboard appends /api/v1/tenant_quotas and /metrics.",
            obj="KVPOOL_MASTER_ADMIN_URL", id="kvpool.E005"))

    address = getattr(settings, "KVPOOL_MASTER_ADDRESS", None)
    problem = None
    if not isinstance(address, str) or not address:
        problem = f"{address!r} is not an address"
    elif "://" in address or "/" in address:
        problem = f"{address!r} is not a bare host:port"
    else:
        problem = _url_problem(f"tcp://{address}", ("tcp",))
        problem = problem and f"{address!r} is not host:port"
    if problem:
        errors.append(checks.Error(
            f"KVPOOL_MASTER_ADDRESS: {problem}.",
            hint="The master's RPC address as engines' Mooncake clients take it (master_server_address), "
                 "e.g. 127.0.0.1:50051 or [::1]:50051.",
            obj="KVPOOL_MASTER_ADDRESS", id="kvpool.E006"))

    metadata = getattr(settings, "KVPOOL_METADATA_SERVER", None)
    metadata_hint = ("http://host:port/metadata (the master's embedded HTTP metadata server), P2PHANDSHAKE, or "
                     "an etcd://host:port / redis://host:port metadata service.")
    if not isinstance(metadata, str) or not metadata.strip():
        errors.append(checks.Error(f"KVPOOL_METADATA_SERVER must be a non-empty string, not {metadata!r}.",
                                   hint=metadata_hint, obj="KVPOOL_METADATA_SERVER", id="kvpool.E007"))
    elif metadata.lower().startswith(("http://", "https://")):
        try:
            parts = urlsplit(metadata)
            ok = bool(parts.hostname) and parts.port is not None
        except ValueError:
            ok = False
        if not ok:
            errors.append(checks.Error(
                f"KVPOOL_METADATA_SERVER: {metadata!r} names no host and port.", hint=metadata_hint,
                obj="KVPOOL_METADATA_SERVER", id="kvpool.E007"))
    elif metadata != "P2PHANDSHAKE" and not metadata.lower().startswith(("etcd://", "redis://")):
        errors.append(checks.Warning(
            f"KVPOOL_METADATA_SERVER: {metadata!r} is none of the forms Mooncake documents.",
            hint=metadata_hint, obj="KVPOOL_METADATA_SERVER", id="kvpool.W007"))

    protocol = getattr(settings, "KVPOOL_STORE_PROTOCOL", None)
    device = getattr(settings, "KVPOOL_STORE_DEVICE", "")
    if not isinstance(protocol, str) or not protocol.strip():
        errors.append(checks.Error(f"KVPOOL_STORE_PROTOCOL must be a non-empty string, not {protocol!r}.",
                                   hint=_hint_env("KVPOOL_STORE_PROTOCOL", "tcp"), obj="KVPOOL_STORE_PROTOCOL",
                                   id="kvpool.E008"))
    elif protocol not in KNOWN_PROTOCOLS:
        errors.append(checks.Warning(
            f"KVPOOL_STORE_PROTOCOL={protocol!r} is neither 'tcp' nor 'rdma'.",
            hint="Engines get it as the Mooncake client's protocol; check that their transfer engine supports it.",
            obj="KVPOOL_STORE_PROTOCOL", id="kvpool.W001"))
    if not isinstance(device, str):
        errors.append(checks.Error(f"KVPOOL_STORE_DEVICE must be a string, not {device!r}.",
                                   hint="RDMA device names separated by commas, or '' for TCP / auto-detection.",
                                   obj="KVPOOL_STORE_DEVICE", id="kvpool.E008"))
    return errors


@checks.register(TAG)
def check_master_ha(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """E016, W009: the HA master set (``tenants.masters.MasterTopology``) when ``KVPOOL_MASTER_HA_ETCD_ENDPOINTS``
    is set."""
    from tenants.masters import MasterTopology

    etcd = getattr(settings, "KVPOOL_MASTER_HA_ETCD_ENDPOINTS", "")
    if isinstance(etcd, str) and not etcd.strip():
        return []
    hint = ("HA mode: KVPOOL_MASTER_HA_ETCD_ENDPOINTS=10.0.0.1:2379;10.0.0.2:2379, "
            "KVPOOL_MASTER_HA_ADDRESSES=10.0.0.11:50051,10.0.0.12:50051 and "
            "KVPOOL_MASTER_HA_ADMIN_URLS=http://10.0.0.11:9003,http://10.0.0.12:9003 (same order); see docs/ha.md.")
    try:
        if not isinstance(etcd, str):
            raise ValueError(f"KVPOOL_MASTER_HA_ETCD_ENDPOINTS must be a string, not {etcd!r}")
        topology = MasterTopology.from_settings()
    except (TypeError, ValueError) as exc:
        return [checks.Error(f"{exc}.", hint=hint, obj="KVPOOL_MASTER_HA_ETCD_ENDPOINTS", id="kvpool.E016")]
    warnings: list[checks.CheckMessage] = []
    if len(topology.masters) < 2:
        warnings.append(checks.Warning(
            "HA mode with one master: nothing takes over when it stops.",
            hint="List a standby in KVPOOL_MASTER_HA_ADDRESSES and KVPOOL_MASTER_HA_ADMIN_URLS.",
            obj="KVPOOL_MASTER_HA_ADDRESSES", id="kvpool.W009"))
    metadata = getattr(settings, "KVPOOL_METADATA_SERVER", "")
    if isinstance(metadata, str) and metadata.lower().startswith(("http://", "https://")):
        warnings.append(checks.Warning(
            f"KVPOOL_METADATA_SERVER={metadata!r} in HA mode: no master serves HTTP metadata in HA mode (a master's "
            "embedded server would die with it, and clients could no longer start).",
            hint=f"Use the etcd endpoints, KVPOOL_METADATA_SERVER=etcd://{';'.join(topology.etcd_endpoints)}, or "
                 "P2PHANDSHAKE.", obj="KVPOOL_METADATA_SERVER", id="kvpool.W009"))
    return warnings


@checks.register(TAG)
def check_paths_and_flags(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """E009–E012: engine config directory, quota policy path, master sync flag, metrics token."""
    errors: list[checks.CheckMessage] = []
    config_dir = getattr(settings, "KVPOOL_ENGINE_CONFIG_DIR", None)
    if not isinstance(config_dir, str) or not posixpath.isabs(config_dir):
        errors.append(checks.Error(
            f"KVPOOL_ENGINE_CONFIG_DIR must be an absolute path on the nodes, not {config_dir!r}.",
            hint=_hint_env("KVPOOL_ENGINE_CONFIG_DIR", "/etc/kvpool"), obj="KVPOOL_ENGINE_CONFIG_DIR",
            id="kvpool.E009"))
    quotas_path = getattr(settings, "KVPOOL_TENANT_QUOTAS_PATH", None)
    if not isinstance(quotas_path, str) or not quotas_path.strip():
        errors.append(checks.Error(
            f"KVPOOL_TENANT_QUOTAS_PATH must be a file path, not {quotas_path!r}.",
            hint=_hint_env("KVPOOL_TENANT_QUOTAS_PATH", "/var/lib/kvpool/tenant_quotas.yaml"),
            obj="KVPOOL_TENANT_QUOTAS_PATH", id="kvpool.E010"))
    sync = getattr(settings, "KVPOOL_MASTER_SYNC", None)
    if not isinstance(sync, bool):
        errors.append(checks.Error(f"KVPOOL_MASTER_SYNC must be True or False, not {sync!r}.",
                                   hint=_hint_env("KVPOOL_MASTER_SYNC", "true"), obj="KVPOOL_MASTER_SYNC",
                                   id="kvpool.E011"))
    token = getattr(settings, "KVPOOL_METRICS_TOKEN", "")
    if not isinstance(token, str) or any(char.isspace() for char in token):
        errors.append(checks.Error(
            "KVPOOL_METRICS_TOKEN must be a string without whitespace (scrapers send it as "
            "'Authorization: Bearer <token>').",
            hint="Leave it empty for an open /metrics, or use a token such as the output of "
                 "'python -c \"import secrets; print(secrets.token_urlsafe())\"'.",
            obj="KVPOOL_METRICS_TOKEN", id="kvpool.E012"))
    return errors


@checks.register(TAG, deploy=True)
def check_metrics_token(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """``kvpool.W008`` (deploy checks): ``/metrics`` without a bearer token outside ``DEBUG``."""
    if settings.DEBUG or getattr(settings, "KVPOOL_METRICS_TOKEN", "") != "":
        return []
    return [checks.Warning(
        "KVPOOL_METRICS_TOKEN is empty: /metrics answers anyone who reaches the dashboard, without logging in, and "
        "its gauges name every tenant, served model, release namespace and request group with their occupancy "
        "and quotas.",
        hint="Set KVPOOL_METRICS_TOKEN (e.g. the output of 'python -c \"import secrets; print(secrets.token_urlsafe())"
             "\"') and give Prometheus 'authorization: {credentials: <token>}' (Authorization: Bearer <token>).",
        obj="KVPOOL_METRICS_TOKEN", id="kvpool.W008")]


def _relation(first: str, second: str, holds: Callable[[int, int], bool]) -> tuple[int, int] | None:
    """The two integer settings' values when both are valid and ``holds`` is false, else ``None``."""
    a, b = _integer(first), _integer(second)
    if a is None or b is None or a < _INTEGERS[first] or b < _INTEGERS[second] or holds(a, b):
        return None
    return a, b


@checks.register(TAG)
def check_timing_relations(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """W002–W006: durations that only make sense relative to one another or to the agents' periods."""
    warnings: list[checks.CheckMessage] = []
    pair = _relation("KVPOOL_PUSH_EXPIRES_SECONDS", "KVPOOL_REPUSH_AFTER_SECONDS", lambda e, r: e >= r)
    if pair:
        warnings.append(checks.Warning(
            f"KVPOOL_PUSH_EXPIRES_SECONDS ({pair[0]}) is shorter than KVPOOL_REPUSH_AFTER_SECONDS ({pair[1]}).",
            hint="A document can expire in a busy or offline node's queue well before the dashboard sends it "
                 "again; keep the expiry at least as long as the re-push period.",
            obj="KVPOOL_PUSH_EXPIRES_SECONDS", id="kvpool.W002"))
    pair = _relation("KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS", "KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS",
                     lambda age, horizon: age <= horizon)
    if pair:
        warnings.append(checks.Warning(
            f"KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS ({pair[0]}) exceeds the receipt horizon "
            f"KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS ({pair[1]}).",
            hint="Acks and reports older than the receipts kept are refused as 'expired' anyway; only heartbeats "
                 "and purge results get the longer window. Lower the maximum age or keep receipts longer.",
            obj="KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS", id="kvpool.W003"))
    silence = _integer("KVPOOL_HEARTBEAT_SILENCE_SECONDS")
    if silence is not None and 1 <= silence < 2 * AGENT_HEARTBEAT_INTERVAL:
        warnings.append(checks.Warning(
            f"KVPOOL_HEARTBEAT_SILENCE_SECONDS ({silence}) is shorter than two agent heartbeats "
            f"({AGENT_HEARTBEAT_INTERVAL} s apart by default).",
            hint="Healthy nodes would be flagged silent between heartbeats; use at least "
                 f"{2 * AGENT_HEARTBEAT_INTERVAL} s (default 12).",
            obj="KVPOOL_HEARTBEAT_SILENCE_SECONDS", id="kvpool.W004"))
    window = _integer("KVPOOL_METRICS_WINDOW_SECONDS")
    if window is not None and 1 <= window < 2 * AGENT_REPORT_INTERVAL:
        warnings.append(checks.Warning(
            f"KVPOOL_METRICS_WINDOW_SECONDS ({window}) is shorter than two agent reports "
            f"({AGENT_REPORT_INTERVAL} s apart by default).",
            hint="Nodes would drop out of the /metrics sums between their reports; use at least "
                 f"{2 * AGENT_REPORT_INTERVAL} s (default 120).",
            obj="KVPOOL_METRICS_WINDOW_SECONDS", id="kvpool.W005"))
    timeout = _integer("KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS")
    sample = (getattr(settings, "CELERY_BEAT_SCHEDULE", None) or {}).get("sample-master-quotas", {})
    period = sample.get("schedule") if isinstance(sample, dict) else None
    if timeout is not None and timeout >= 1 and _is_number(period) and 0 < period <= timeout:
        warnings.append(checks.Warning(
            f"KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS ({timeout}) is not shorter than the master sampling period "
            f"KVPOOL_MASTER_SAMPLE_SECONDS ({period}).",
            hint="While the master does not answer, sampling tasks would queue up faster than they time out.",
            obj="KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS", id="kvpool.W006"))
    return warnings


@checks.register(TAG)
def check_production_secrets(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """E014: outside DEBUG the secret key is a real one (``dashboard.env.env_secret_key`` refuses the environment's;
    this catches a settings module that sets it directly); E015: the TLS proxy header is a pair Django can use."""
    from dashboard.env import DEV_SECRET_KEY

    errors: list[checks.CheckMessage] = []
    key = getattr(settings, "SECRET_KEY", "")
    if not getattr(settings, "DEBUG", False) and (not isinstance(key, str) or key.strip() in ("", DEV_SECRET_KEY)):
        errors.append(checks.Error(
            "SECRET_KEY is empty or the development key, and DEBUG is off.",
            hint="Set DJANGO_SECRET_KEY to 50+ random characters (python -c 'import secrets; "
                 "print(secrets.token_urlsafe(50))') and keep it secret.",
            obj="SECRET_KEY", id="kvpool.E014"))
    header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if header is not None and not (
        isinstance(header, tuple) and len(header) == 2 and all(isinstance(part, str) and part for part in header)
        and header[0].startswith("HTTP_")
    ):
        errors.append(checks.Error(
            f"SECURE_PROXY_SSL_HEADER must be ('HTTP_<HEADER>', '<value>') or None, not {header!r}.",
            hint='Set DJANGO_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https" (the header your TLS proxy sets).',
            obj="SECURE_PROXY_SSL_HEADER", id="kvpool.E015"))
    return errors
