"""Django settings for the KV-cache pool control plane.

Everything deployment-specific comes from the environment (see ``dashboard/env.py`` and README "Pointing it at a
real cluster"). Defaults are the single-machine demo: SQLite under ``var/``, Redis on 127.0.0.1:6379.
"""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from dashboard.env import (
    env_bool,
    env_broker,
    env_database,
    env_int,
    env_list,
    env_proxy_ssl_header,
    env_rate,
    env_ratio,
    env_secret_key,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("KVPOOL_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DJANGO_DEBUG", False)
# Outside DEBUG there is no default: an unset key stops every entry point (manage.py, WSGI, Celery) with one line.
SECRET_KEY = env_secret_key("DJANGO_SECRET_KEY", debug=DEBUG)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])

# --- HTTPS (README "Production settings"; `manage.py check --deploy` is clean with all of them set) ----------
# Off by default: the demo and a first look run over plain HTTP on loopback.
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
# Session and CSRF cookies only over HTTPS.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", False)
# Behind a proxy that terminates TLS: "X-Forwarded-Proto: https" (the header the proxy sets, and its value).
SECURE_PROXY_SSL_HEADER = env_proxy_ssl_header("DJANGO_SECURE_PROXY_SSL_HEADER")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# --- Request limits (dashboard.limits), applied before anything parses a body -------------------------------
# Largest request body (bytes; larger is HTTP 413) and deepest JSON nesting (arrays/objects; deeper is HTTP 400).
KVPOOL_MAX_REQUEST_BYTES = env_int("KVPOOL_MAX_REQUEST_BYTES", 1 << 20, minimum=64 << 10)
KVPOOL_MAX_JSON_DEPTH = env_int("KVPOOL_MAX_JSON_DEPTH", 32, minimum=8)
DATA_UPLOAD_MAX_MEMORY_SIZE = KVPOOL_MAX_REQUEST_BYTES

INSTALLED_APPS = [
    # django.contrib.admin, for platform admins only (tenants.admin_site).
    "tenants.admin_site.PlatformAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    # API tokens stored as SHA-512 digests only, with expiry and per-token revocation (README "API tokens").
    "knox",
    # Login lockout after repeated wrong passwords (login form and the token endpoint).
    "axes",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI / Redoc served from static files (works offline, no CDN)
    "tenants",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Body size and JSON depth limits, before sessions, CSRF, authentication or any parser (dashboard.limits).
    "dashboard.limits.RequestLimitsMiddleware",
    # Static files (CSS, vendored Chart.js, Swagger UI) are served by the app itself, DEBUG or not.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "tenants.middleware.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a login refused by django-axes (too many wrong passwords) into its lockout page (HTTP 429).
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username + client address before any password is checked (django-axes).
    "axes.backends.AxesStandaloneBackend",
    # Passwords and model permissions, under the tenant rules (tenants.access: memberships, platform admins).
    "tenants.access.TenantAccessBackend",
]

ROOT_URLCONF = "dashboard.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            # {{ value|humanize_bytes }} on every page (binary units, IEC suffixes)
            "builtins": ["dashboard.templatetags.byte_units"],
        },
    },
]

WSGI_APPLICATION = "dashboard.wsgi.application"

DATABASES = {"default": env_database("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}", conn_max_age=60)}
# SQLite (the embedded default, or any sqlite:// DATABASE_URL) is written by the web server and the Celery worker at
# once. WAL: readers and the one writer do not block each other. IMMEDIATE: a transaction takes the write lock when
# it begins; a deferred one that read first failed at once with "database is locked" (HTTP 500) when another
# process was writing, whatever the timeout. timeout: a writer waits up to 30 s for the lock (Python's default: 5).
# Options given in DATABASE_URL win.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    for _option, _value in {"init_command": "PRAGMA journal_mode=WAL;", "transaction_mode": "IMMEDIATE",
                            "timeout": 30}.items():
        DATABASES["default"].setdefault("OPTIONS", {}).setdefault(_option, _value)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "dashboard" / "static"]
# ``manage.py collectstatic`` copies everything here (optional: WhiteNoise also serves straight from the apps'
# static folders through the finders, so a fresh checkout serves CSS and Chart.js without that step).
STATIC_ROOT = BASE_DIR / "staticfiles"
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "dashboard.api.authentication.TokenAuthentication",  # knox's; a non-ASCII token is a 401, not a 500
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "dashboard.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "dashboard.api.schema.AutoSchema",
    # Throttles key anonymous clients by address: REMOTE_ADDR, or with N proxies in front the N-th address from the
    # right of X-Forwarded-For (never a header a client could set alone).
    "NUM_PROXIES": env_int("KVPOOL_NUM_PROXIES", 0, minimum=0),
    # POST /api/v1/auth-token/ per client address (dashboard.api.tokens); django-axes locks on top of it.
    "DEFAULT_THROTTLE_RATES": {"auth-token": env_rate("KVPOOL_AUTH_TOKEN_RATE", "10/min")},
}

# --- Logins and API tokens (README "Users, tenants and tokens") ---------------------------------------------
# API tokens (django-rest-knox): only a SHA-512 digest is stored; the token is shown once, when it is created.
# A token expires after KVPOOL_API_TOKEN_TTL_HOURS; it is revoked by deleting it (API, manage.py, admin).
REST_KNOX = {
    "TOKEN_TTL": timedelta(hours=env_int("KVPOOL_API_TOKEN_TTL_HOURS", 30 * 24, minimum=1)),
    "AUTH_HEADER_PREFIX": "Token",
    "AUTO_REFRESH": False,
}
# Wrong passwords (django-axes, login form and token endpoint alike): after KVPOOL_LOGIN_FAILURE_LIMIT failures
# for one username from one client address, that pair is locked for KVPOOL_LOGIN_COOLOFF_MINUTES, the correct
# password included (HTTP 429); a success before that resets the count. Locks are rows in the database, so every
# worker process sees them; `manage.py axes_reset` lifts them.
AXES_FAILURE_LIMIT = env_int("KVPOOL_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("KVPOOL_LOGIN_COOLOFF_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# HTTP 429: JSON under /api/, the page registration/locked_out.html elsewhere.
AXES_LOCKOUT_CALLABLE = "dashboard.views.accounts.lockout_response"
# Password reset by e-mail exists only where mail is configured (DJANGO_EMAIL_HOST); elsewhere its pages say so
# and send nothing (dashboard.views.accounts).
EMAIL_HOST = env_str("DJANGO_EMAIL_HOST", "")
EMAIL_PORT = env_int("DJANGO_EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("DJANGO_EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("DJANGO_EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("DJANGO_EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DJANGO_DEFAULT_FROM_EMAIL", "kvpool@localhost")

SPECTACULAR_SETTINGS = {
    "TITLE": "KV-cache pool control plane API",
    "DESCRIPTION": "Registry of tenants, served models, release namespaces and request groups for a shared "
    "Mooncake Store, and the engine configuration rendered from it.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and Swagger UI need a logged-in user or a token, like everything else under /api/.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Separate request and response components (read-only fields only in responses, write-only in requests).
    "COMPONENT_SPLIT_REQUEST": True,
    # One component per choice set, whatever the field is called (`check --deploy` warns otherwise).
    "ENUM_NAME_OVERRIDES": {"ReleaseStateEnum": "tenants.choices.ReleaseState"},
    # Error responses, id ranges and blank query values on every operation (dashboard.api.schema).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "dashboard.api.schema.document_api"],
}

# --- Celery (broker: Redis) -------------------------------------------------------------------------------
CELERY_BROKER_URL = env_broker("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "dashboard.control"
CELERY_TASK_ROUTES = {"dashboard.ingest": {"queue": "dashboard.ingest"}}
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# visibility_timeout: seconds before a message a worker took but never acked (it died, or Redis restarted under
# it) is delivered again; ingest and push are idempotent, so a redelivery is harmless.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "socket_connect_timeout": 3,
    "visibility_timeout": env_int("KVPOOL_BROKER_VISIBILITY_TIMEOUT", 3600, minimum=1),
}
# Periodic tasks (run `celery -A dashboard.celery beat`); periods in seconds.
CELERY_BEAT_SCHEDULE = {
    "reconcile-configs": {"task": "dashboard.reconcile_configs",
                          "schedule": env_int("KVPOOL_RECONCILE_SECONDS", 30, minimum=1)},
    "rollup-occupancy": {"task": "dashboard.rollup_occupancy",
                         "schedule": env_int("KVPOOL_ROLLUP_SECONDS", 60, minimum=1)},
    "sync-master-quotas": {"task": "dashboard.sync_master_quotas",
                           "schedule": env_int("KVPOOL_MASTER_SYNC_SECONDS", 60, minimum=1)},
    "sample-master-quotas": {"task": "dashboard.sample_master_quotas",
                             "schedule": env_int("KVPOOL_MASTER_SAMPLE_SECONDS", 15, minimum=1)},
    # Master up / restarted (dashboard.master.health): detected within this many seconds.
    "probe-master": {"task": "dashboard.probe_master",
                     "schedule": env_int("KVPOOL_MASTER_PROBE_SECONDS", 5, minimum=1)},
}
# A detected master restart fails the master_healthy check for this long (dashboard.checklist).
KVPOOL_MASTER_RESTART_FLAG_SECONDS = env_int("KVPOOL_MASTER_RESTART_FLAG_SECONDS", 600, minimum=1)
# Push: a node whose ack lags its desired version gets the latest document again after this many seconds.
KVPOOL_REPUSH_AFTER_SECONDS = env_int("KVPOOL_REPUSH_AFTER_SECONDS", 30, minimum=1)
# A pushed document left unconsumed this long expires in the queue (a re-push sends the newest one).
KVPOOL_PUSH_EXPIRES_SECONDS = env_int("KVPOOL_PUSH_EXPIRES_SECONDS", 3600, minimum=1)
# Telemetry rollups: raw (per-report) samples older than this become 1-minute rows, 1-minute rows older than
# the next become 1-hour rows, and 1-hour rows / master quota samples older than the retention are deleted.
KVPOOL_ROLLUP_RAW_AFTER_SECONDS = env_int("KVPOOL_ROLLUP_RAW_AFTER_SECONDS", 3600, minimum=60)
KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS = env_int("KVPOOL_ROLLUP_MINUTE_AFTER_SECONDS", 2 * 86400, minimum=3600)
KVPOOL_RETENTION_SECONDS = env_int("KVPOOL_RETENTION_SECONDS", 90 * 86400, minimum=3600)
KVPOOL_MASTER_SAMPLE_RETENTION_SECONDS = env_int("KVPOOL_MASTER_SAMPLE_RETENTION_SECONDS", 14 * 86400, minimum=60)
# Chargeback (dashboard.telemetry.chargeback): a raw occupancy sample holds at most this long; after that its cache
# scope counts as absent on that node until its next sample.
KVPOOL_CHARGEBACK_MAX_GAP_SECONDS = env_int("KVPOOL_CHARGEBACK_MAX_GAP_SECONDS", 60, minimum=1)
# Node accounts no tenant's engine_user may name (tenants.validators.validate_engine_user; root is always refused):
# the control plane's own accounts (deploy/systemd: dashboard/worker/beat, master, the engine template's
# placeholder) and well-known service accounts. The node agent refuses system accounts by uid too.
KVPOOL_RESERVED_ACCOUNTS = env_list("KVPOOL_RESERVED_ACCOUNTS", [
    "kvpool", "kvpool-master", "kvpool-engine-unassigned", "root", "nobody", "daemon", "bin", "sys", "www-data",
    "postgres", "redis", "etcd", "systemd-network", "systemd-resolve", "messagebus", "sshd"])
# Sync registry quotas to the master's admin API (KVPOOL_MASTER_ADMIN_URL); tenant_quotas.yaml is written here.
KVPOOL_MASTER_SYNC = env_bool("KVPOOL_MASTER_SYNC", True)
KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS = env_int("KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS", 3, minimum=1)
KVPOOL_TENANT_QUOTAS_PATH = env_str("KVPOOL_TENANT_QUOTAS_PATH", str(VAR_DIR / "tenant_quotas.yaml"))
# The master's global eviction flags (rendered into its command line by tenants.rendering.render_master, and the
# watermark the budget checks and implicit budgets keep under: tenants.room): --eviction_high_watermark_ratio and
# --eviction_ratio, in (0, 1]. Set them to what the running master was started with.
KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO = env_ratio("KVPOOL_MASTER_EVICTION_HIGH_WATERMARK_RATIO", 0.9)
KVPOOL_MASTER_EVICTION_RATIO = env_ratio("KVPOOL_MASTER_EVICTION_RATIO", 0.05)
# Optional bearer token for /metrics (empty: open, as Prometheus scrapers usually expect on a private network).
KVPOOL_METRICS_TOKEN = env_str("KVPOOL_METRICS_TOKEN", "")
# /metrics sums each node's newest occupancy report younger than this (older nodes drop out of the sums).
KVPOOL_METRICS_WINDOW_SECONDS = env_int("KVPOOL_METRICS_WINDOW_SECONDS", 120, minimum=1)
# /metrics series cap, per family (0 = no cap): cache-scope families keep the N scopes with the most occupancy bytes,
# per-instance (kvpool_engine_*) and per-node families the N instances / nodes in trouble first; the rest are summed
# into one row labelled "(other)" and counted in kvpool_metrics_series_dropped{family} (dashboard.telemetry.series_cap).
# 1,000 keeps a scrape of 10,000 scopes, 1,000 nodes and 8,000 engine instances near one second (bench.metrics_scrape).
KVPOOL_METRICS_MAX_SERIES = env_int("KVPOOL_METRICS_MAX_SERIES", 1000, minimum=0)

# --- Mooncake Store endpoints the rendered configs point at ------------------------------------------------
KVPOOL_MASTER_ADDRESS = env_str("KVPOOL_MASTER_ADDRESS", "127.0.0.1:50051")
KVPOOL_METADATA_SERVER = env_str("KVPOOL_METADATA_SERVER", "http://127.0.0.1:8080/metadata")
KVPOOL_MASTER_ADMIN_URL = env_str("KVPOOL_MASTER_ADMIN_URL", "http://127.0.0.1:9003")
KVPOOL_STORE_PROTOCOL = env_str("KVPOOL_STORE_PROTOCOL", "tcp")
# The master in HA mode (tenants.masters, docs/ha.md): etcd endpoints (host:port, ';' or ',' between them; empty =
# one master, the two settings above), each master's RPC host:port and admin URL in the same order (comma-separated),
# and --enable_oplog (standbys replay the leader's metadata: objects survive a failover). Clients then get
# master_server_address=etcd://<endpoints>; KVPOOL_MASTER_ADDRESS and KVPOOL_MASTER_ADMIN_URL are not used.
KVPOOL_MASTER_HA_ETCD_ENDPOINTS = env_str("KVPOOL_MASTER_HA_ETCD_ENDPOINTS", "")
KVPOOL_MASTER_HA_ADDRESSES = env_list("KVPOOL_MASTER_HA_ADDRESSES", [])
KVPOOL_MASTER_HA_ADMIN_URLS = env_list("KVPOOL_MASTER_HA_ADMIN_URLS", [])
KVPOOL_MASTER_HA_OPLOG = env_bool("KVPOOL_MASTER_HA_OPLOG", True)
# A detected failover (another master leads) fails the master_healthy check for this long (dashboard.checklist).
KVPOOL_MASTER_FAILOVER_FLAG_SECONDS = env_int("KVPOOL_MASTER_FAILOVER_FLAG_SECONDS", 600, minimum=1)
# Rendered into every engine's Mooncake client config: device (RDMA NIC, "" for TCP), mounted segment and
# transfer buffer sizes in bytes, and where engine config files are written on the nodes.
KVPOOL_STORE_DEVICE = env_str("KVPOOL_STORE_DEVICE", "")
KVPOOL_GLOBAL_SEGMENT_SIZE = env_int("KVPOOL_GLOBAL_SEGMENT_SIZE", 4 << 30, minimum=16 << 20)
KVPOOL_LOCAL_BUFFER_SIZE = env_int("KVPOOL_LOCAL_BUFFER_SIZE", 512 << 20, minimum=1 << 20)
KVPOOL_ENGINE_CONFIG_DIR = env_str("KVPOOL_ENGINE_CONFIG_DIR", "/etc/kvpool")
# A node without a heartbeat for this long is silent (Checks: nodes_reporting; /metrics: kvpool_node_silent).
# Agents send one every 5 s by default (--heartbeat-interval): 12 s = two missed, flagged within 15 s.
KVPOOL_HEARTBEAT_SILENCE_SECONDS = env_int("KVPOOL_HEARTBEAT_SILENCE_SECONDS", 12, minimum=1)
# Agent messages are accepted this long after the agent signed them, and this far ahead (dashboard.agent_auth).
KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS = env_int("KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS", 6 * 3600, minimum=60)
KVPOOL_AGENT_CLOCK_SKEW_SECONDS = env_int("KVPOOL_AGENT_CLOCK_SKEW_SECONDS", 300, minimum=0)
# Instance caps (tenants.placement): per node (every instance is in the document each of the node's tenants gets,
# about 2.7 KB each: 64 make ~170 KB; a node of 8 GPUs split by MIG runs at most 56), per tenant on one node
# (so one tenant cannot fill a shared node), and per tenant in all.
KVPOOL_MAX_INSTANCES_PER_NODE = env_int("KVPOOL_MAX_INSTANCES_PER_NODE", 64, minimum=1)
KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE = env_int("KVPOOL_MAX_INSTANCES_PER_TENANT_PER_NODE", 16, minimum=1)
KVPOOL_MAX_INSTANCES_PER_TENANT = env_int("KVPOOL_MAX_INSTANCES_PER_TENANT", 256, minimum=1)
# Request groups per tenant: every instance of the tenant carries all of them in its node's document.
KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT = env_int("KVPOOL_MAX_REQUEST_GROUPS_PER_TENANT", 256, minimum=1)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    # kvpool.* records reach the console through the root logger only: a Celery worker replaces the root's
    # handlers with its own, so a handler on "kvpool" as well would print every line twice there.
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "kvpool": {"level": env_str("KVPOOL_LOG_LEVEL", "INFO")},
    },
}

VAR_DIR.mkdir(parents=True, exist_ok=True)
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns about a missing STATIC_ROOT before collectstatic
