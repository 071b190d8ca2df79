"""Django settings for the KV-cache pool control plane.

Everything deployment-specific comes from the environment (see ``dashboard/env.py`` and README "Pointing it at a
real cluster"). Defaults are the single-machine demo: SQLite under ``var/``, Redis on 127.0.0.1:6379.
"""
from __future__ import annotations

from pathlib import Path

from dashboard.env import env_bool, env_broker, env_database, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("KVPOOL_VAR_DIR", str(BASE_DIR / "var")))

SECRET_KEY = env_str("DJANGO_SECRET_KEY", "insecure-dev-key-change-me")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI / Redoc served from static files (works offline, no CDN)
    "tenants",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files (CSS, vendored Chart.js, Swagger UI) are served by the app itself, DEBUG or not.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "tenants.middleware.AuditContextMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
        },
    },
]

WSGI_APPLICATION = "dashboard.wsgi.application"

DATABASES = {"default": env_database("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}", conn_max_age=60)}
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
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "dashboard.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

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
}
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
# Sync registry quotas to the master's admin API (KVPOOL_MASTER_ADMIN_URL); tenant_quotas.yaml is written here.
KVPOOL_MASTER_SYNC = env_bool("KVPOOL_MASTER_SYNC", True)
KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS = env_int("KVPOOL_MASTER_ADMIN_TIMEOUT_SECONDS", 3, minimum=1)
KVPOOL_TENANT_QUOTAS_PATH = env_str("KVPOOL_TENANT_QUOTAS_PATH", str(VAR_DIR / "tenant_quotas.yaml"))
# Optional bearer token for /metrics (empty: open, as Prometheus scrapers usually expect on a private network).
KVPOOL_METRICS_TOKEN = env_str("KVPOOL_METRICS_TOKEN", "")
# /metrics sums each node's newest occupancy report younger than this (older nodes drop out of the sums).
KVPOOL_METRICS_WINDOW_SECONDS = env_int("KVPOOL_METRICS_WINDOW_SECONDS", 120, minimum=1)

# --- Mooncake Store endpoints the rendered configs point at ------------------------------------------------
KVPOOL_MASTER_ADDRESS = env_str("KVPOOL_MASTER_ADDRESS", "127.0.0.1:50051")
KVPOOL_METADATA_SERVER = env_str("KVPOOL_METADATA_SERVER", "http://127.0.0.1:8080/metadata")
KVPOOL_MASTER_ADMIN_URL = env_str("KVPOOL_MASTER_ADMIN_URL", "http://127.0.0.1:9003")
KVPOOL_STORE_PROTOCOL = env_str("KVPOOL_STORE_PROTOCOL", "tcp")
# Rendered into every engine's Mooncake client config: device (RDMA NIC, "" for TCP), mounted segment and
# transfer buffer sizes in bytes, and where engine config files are written on the nodes.
KVPOOL_STORE_DEVICE = env_str("KVPOOL_STORE_DEVICE", "")
KVPOOL_GLOBAL_SEGMENT_SIZE = env_int("KVPOOL_GLOBAL_SEGMENT_SIZE", 4 << 30, minimum=16 << 20)
KVPOOL_LOCAL_BUFFER_SIZE = env_int("KVPOOL_LOCAL_BUFFER_SIZE", 512 << 20, minimum=1 << 20)
KVPOOL_ENGINE_CONFIG_DIR = env_str("KVPOOL_ENGINE_CONFIG_DIR", "/etc/kvpool")
KVPOOL_HEARTBEAT_SILENCE_SECONDS = env_int("KVPOOL_HEARTBEAT_SILENCE_SECONDS", 30, minimum=1)
# Agent messages are accepted this long after the agent signed them, and this far ahead (dashboard.agent_auth).
KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS = env_int("KVPOOL_AGENT_MESSAGE_MAX_AGE_SECONDS", 6 * 3600, minimum=60)
KVPOOL_AGENT_CLOCK_SKEW_SECONDS = env_int("KVPOOL_AGENT_CLOCK_SKEW_SECONDS", 300, minimum=0)

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
