"""Elicit Hub settings: one module, driven by the environment, failing loudly on bad values.

With DATABASE_URL / REDIS_URL unset the project uses the embedded engines under ./var/ (see
elicit_hub.engines); with them set it uses those servers. There is no SQLite path and no in-memory channel
layer: development, tests and production run on the same engines.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from channels_redis.core import RedisChannelLayer
from csp import constants as csp
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.connection import parse_url as parse_redis_url
from redis.retry import Retry

from elicit_hub import engines

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise ImproperlyConfigured(f"Set the {name} environment variable.")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be true or false, not {raw!r}.")


def env_int(name: str, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a whole number, not {raw!r}.") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}.")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, not {value}.")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


# The periods of a rate, as django-ninja's limiter reads them (ninja.throttling.SimpleRateThrottle._PERIODS).
# Not imported: ninja reads its settings as it is imported, and these settings are not all made yet.
RATE_PERIODS = {"sec": 1, "min": 60, "hour": 3600, "day": 86400, "s": 1, "m": 60, "h": 3600, "d": 86400}


def rate_of(value: str) -> tuple[int, int] | None:
    """A rate "count/period" (600/m, 5/15m, 60/hour) as (count, seconds), or None when the API's limiter
    could not read it or it allows nothing."""
    count, slash, period = value.strip().partition("/")
    unit = next((unit for unit in RATE_PERIODS if period.endswith(unit)), "")
    multiple = period[: len(period) - len(unit)]
    if not slash or not count.isdigit() or not ((multiple == "" and unit) or multiple.isdigit()):
        return None
    seconds = (int(multiple) if multiple else 1) * RATE_PERIODS.get(unit, 1)
    return (int(count), seconds) if int(count) >= 1 and seconds >= 1 else None


def env_rate(name: str, default: str) -> str:
    """A rate limit's setting: one the limiter could not read fails here, naming it, instead of in a traceback
    from the first module that builds a limit (the API's URLs, in every web process and in `manage.py
    check` before it could say which setting it was)."""
    value = env_str(name, default)
    if rate_of(value) is None:
        raise ImproperlyConfigured(
            f'{name} must be a rate written "count/period": a positive count, then s, m, h or d, as in 600/m '
            f"or 5/15m; not {value[:40]!r}."
        )
    return value


def development_secret_key(path: Path) -> str:
    """This checkout's own secret key, made once and kept in ./var (mode 0600): never a public constant.

    Written to a private temporary file and hard-linked into place, so processes starting together all read
    the same complete key."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".secret_key.")  # mode 0600
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(50))
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    return path.read_text().strip()


# False unless set: `make run` and the test suite set DJANGO_DEBUG=true themselves.
DEBUG = env_bool("DJANGO_DEBUG", False)

# Separates hubs sharing one Redis (e.g. `make test` beside `make run`): queue, channel and cache prefixes.
ELICIT_NAMESPACE = env_str("ELICIT_NAMESPACE", "elicit")

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or (
    development_secret_key(engines.VAR_DIR / "secret_key") if DEBUG else ""
)
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY must be set to a real secret when DJANGO_DEBUG is false"
        " (for development, as `make run` does: DJANGO_DEBUG=true)."
    )

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
if not ALLOWED_HOSTS:
    # Django would start and answer every request 400 ("Bad Request"), which says nothing of why.
    raise ImproperlyConfigured(
        "DJANGO_ALLOWED_HOSTS must list the host names the hub is reached by when DJANGO_DEBUG is false"
        " (comma-separated, e.g. hub.example.com)."
    )
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "ninja",
    "csp",
    "approvals",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "elicit_hub.content_policy.HubCSPMiddleware",
    # Daphne serves no static files; WhiteNoise does, from the app and project static folders.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # 503 while PostgreSQL or Redis is down (JSON under /api/); refuses writes while Redis is.
    "approvals.outage.OutageMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # HEAD on every GET address: the GET's answer without its body (ninja and require_GET take GET only).
    "approvals.middleware.HeadMiddleware",
    # A 404 or 405 that Django or django-ninja answered on their own: JSON under /api/, a page elsewhere.
    "approvals.middleware.ErrorShapeMiddleware",
    # Bodies over ELICIT_MAX_BODY: 413 (JSON under /api/, a page elsewhere) before anything reads them (it
    # runs as the chain goes in, before any view or process_view). The web process's handler
    # (elicit_hub.handler) runs the whole chain and the view synchronously, in one hop to the request's
    # thread.
    "approvals.middleware.BodyLimitMiddleware",
]

ROOT_URLCONF = "elicit_hub.urls"
ASGI_APPLICATION = "elicit_hub.asgi.application"
WSGI_APPLICATION = None

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
                "django.template.context_processors.i18n",
            ],
        },
    },
]

# --- engines -------------------------------------------------------------------------------------------

USING_EMBEDDED_ENGINES = not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL")
DATABASE_URL = os.environ.get("DATABASE_URL") or engines.database_url()
try:
    # No persistent connections (CONN_MAX_AGE 0): each process draws from its own pool instead, and a
    # request or task hands its connection back when it ends.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
except ValueError as exc:
    raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured("DATABASE_URL must point at PostgreSQL (postgres://...).")
# Django's PostgreSQL backend, whose pool checks a connection it lends with a round trip only when the server
# sent something on it (elicit_hub.postgres): the first request after a PostgreSQL restart still gets a
# working connection.
DATABASES["default"]["ENGINE"] = "elicit_hub.postgres"
# Connections per process (web server, each worker child): at most ELICIT_DB_POOL_MAX, ELICIT_DB_POOL_MIN
# kept open. A request that finds the pool empty waits ELICIT_DB_POOL_TIMEOUT s, then gets a 503.
# ELICIT_DB_POOL_MAX=0 turns the pool off (e.g. behind PgBouncer): a connection per request, closed after it.
ELICIT_DB_POOL_MAX = env_int("ELICIT_DB_POOL_MAX", 10)
ELICIT_DB_POOL_MIN = env_int("ELICIT_DB_POOL_MIN", 1)
ELICIT_DB_POOL_TIMEOUT = env_int("ELICIT_DB_POOL_TIMEOUT", 10, minimum=1)
if ELICIT_DB_POOL_MAX:
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": min(ELICIT_DB_POOL_MIN, ELICIT_DB_POOL_MAX),
        "max_size": ELICIT_DB_POOL_MAX,
        "timeout": ELICIT_DB_POOL_TIMEOUT,
    }
# Server-side parameter binding: a statement's text no longer holds its values, so psycopg prepares the
# statements a pooled connection runs again and again (after ELICIT_DB_PREPARE_THRESHOLD runs) and
# PostgreSQL stops planning them anew (the inbox's joins took longer to plan than to run). Off (0) behind a
# pooler that cannot keep prepared statements (PgBouncer before 1.21 in transaction mode).
ELICIT_DB_PREPARE_THRESHOLD = env_int("ELICIT_DB_PREPARE_THRESHOLD", 5)
if ELICIT_DB_PREPARE_THRESHOLD:
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        server_side_binding=True, prepare_threshold=ELICIT_DB_PREPARE_THRESHOLD
    )
if os.environ.get("DATABASE_TEST_NAME"):
    DATABASES["default"]["TEST"] = {"NAME": os.environ["DATABASE_TEST_NAME"]}


def _check_redis_url(url: str) -> None:
    """Refuse a Redis URL the clients could not use, at start-up: redis-py would raise on every request
    (a port that is not a number), or quietly use database 0 for a database that is not a number. The
    messages never repeat the URL, which may hold a password."""
    parts = urlsplit(url)
    if parts.scheme not in {"redis", "rediss", "unix"}:
        raise ImproperlyConfigured("REDIS_URL must be redis://, rediss:// or unix://.")
    try:
        parts.port  # noqa: B018  (raises for a port that is not a number, or out of range)
    except ValueError:
        # Not redis-py's message: it quotes the "port", which is part of a password holding an unencoded "/".
        raise ImproperlyConfigured(
            "REDIS_URL: the port is not a number from 0 to 65535 (a password holding /, @ or : must be "
            "percent-encoded)."
        ) from None
    try:
        options = parse_redis_url(url)
    except ValueError as exc:
        raise ImproperlyConfigured(f"REDIS_URL is not a valid Redis URL: {exc}") from None
    if parts.scheme == "unix" and not options.get("path"):
        raise ImproperlyConfigured(
            "REDIS_URL: a unix:// URL names the socket's path (unix:///run/redis.sock)."
        )
    database = parts.path.strip("/") if parts.scheme != "unix" else ""
    if database and not database.isdigit():
        raise ImproperlyConfigured(
            "REDIS_URL: the database after the host must be a number (redis://host:6379/0)."
        )


REDIS_URL = os.environ.get("REDIS_URL") or engines.redis_url()
_check_redis_url(REDIS_URL)


def _celery_broker_from(redis_url: str) -> str:
    parts = urlsplit(redis_url)
    if parts.scheme == "unix":
        return f"redis+socket://{parts.path}" + (
            f"?virtual_host={_db_of(parts.query)}" if parts.query else ""
        )
    return redis_url


def _db_of(query: str) -> str:
    for pair in query.split("&"):
        key, _, value = pair.partition("=")
        if key == "db":
            return value
    return "0"


# Redis timeouts, in seconds. Every client gets explicit ones, so nothing hangs while Redis is away: a
# command or a connect gives up after ELICIT_REDIS_TIMEOUT. A blocking read waits longer than the pop it
# blocks on (channels-redis blocks BRPOP_WAIT s per receive, Celery's broker 1 s); redis-py's default read
# timeout (5 s, as long as channels-redis's pop) closed every idle websocket within seconds.
ELICIT_REDIS_TIMEOUT = env_int("ELICIT_REDIS_TIMEOUT", 3, minimum=1)
CHANNEL_LAYER_BRPOP_WAIT = RedisChannelLayer.brpop_timeout
CELERY_BROKER_BRPOP_WAIT = 1  # kombu's redis transport: Channel.brpop_timeout

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "approvals.channel_layer.ChannelLayer",
        "CONFIG": {
            # A host dict: channels-redis hands everything but `address` to redis-py's from_url, for
            # redis://, rediss:// and unix:// alike.
            "hosts": [
                {
                    "address": REDIS_URL,
                    "socket_timeout": CHANNEL_LAYER_BRPOP_WAIT + ELICIT_REDIS_TIMEOUT,
                    "socket_connect_timeout": ELICIT_REDIS_TIMEOUT,
                }
            ],
            "prefix": ELICIT_NAMESPACE,
            "capacity": 1000,
            "expiry": 30,
        },
    }
}

CACHES = {
    "default": {
        "BACKEND": "approvals.redis_cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": ELICIT_NAMESPACE,
        "OPTIONS": {
            "socket_timeout": ELICIT_REDIS_TIMEOUT,
            "socket_connect_timeout": ELICIT_REDIS_TIMEOUT,
            # One immediate retry on a fresh connection: the first command after a Redis restart finds
            # its pooled connection dead.
            "retry": Retry(NoBackoff(), 1),
        },
    }
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- auth, i18n, static ---------------------------------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Django's backend, refusing sign-ins for a user name or client that failed too often (approvals.throttling).
AUTHENTICATION_BACKENDS = ["approvals.throttling.ThrottledModelBackend"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "approvals:queue"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("fa", "فارسی"), ("de", "Deutsch")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = env_str("DJANGO_TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# WhiteNoise serves straight from the static folders; set DJANGO_STATIC_ROOT to `collectstatic` for a CDN.
STATIC_ROOT = os.environ.get("DJANGO_STATIC_ROOT") or None
WHITENOISE_USE_FINDERS = True

# --- security: strict unless DEBUG -----------------------------------------------------------------------

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
# No inline script or style anywhere (a template that needs one nonces it with {{ request.csp_nonce }});
# connect-src also gets the host's own ws:/wss: origin (elicit_hub.content_policy). No form-action: the
# consent panel's POST answers with a redirect to the server's page.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [csp.SELF],
        "script-src": [csp.SELF, csp.NONCE],
        "style-src": [csp.SELF],
        "img-src": [csp.SELF],
        "connect-src": [csp.SELF],
        "object-src": [csp.NONE],
        "base-uri": [csp.NONE],
        "frame-ancestors": [csp.NONE],
    }
}
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

# --- Celery ----------------------------------------------------------------------------------------------

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL") or _celery_broker_from(REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = ELICIT_NAMESPACE
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = env_int("ELICIT_TASK_TIME_LIMIT", 180, minimum=10)
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 5
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A message whose worker died is redelivered after this many seconds; every countdown must stay below it
# (system check approvals.E001), or Redis would hand a delayed task to a second worker early.
CELERY_VISIBILITY_TIMEOUT = env_int("ELICIT_VISIBILITY_TIMEOUT", 3600, minimum=5)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": CELERY_VISIBILITY_TIMEOUT,
    "socket_timeout": CELERY_BROKER_BRPOP_WAIT + ELICIT_REDIS_TIMEOUT,
    "socket_connect_timeout": ELICIT_REDIS_TIMEOUT,
}
CELERY_BROKER_CONNECTION_TIMEOUT = ELICIT_REDIS_TIMEOUT
# Publishing a task retries briefly, then raises: a request must not hang on a broker that is away.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_BEAT_SCHEDULE = {
    "expire-stale-rounds": {"task": "approvals.tasks.expire_stale", "schedule": 15.0},
    "recover-stuck-work": {"task": "approvals.tasks.recover_stuck", "schedule": 60.0},
    "verify-audit-chain": {"task": "approvals.audit.tasks.verify_chain", "schedule": 3600.0},
    "verify-audit-chain-full": {
        "task": "approvals.audit.tasks.verify_chain",
        "schedule": 86400.0,
        "kwargs": {"full": True},
    },
    "escalate-and-warn": {"task": "approvals.tasks.escalate_and_warn", "schedule": 15.0},
    "sweep-holders": {"task": "approvals.tasks.sweep_holders", "schedule": 15.0},
    # A reviewer whose page went without a word, and whom nobody else looking would clear, leaves the
    # teams' pages within PRESENCE_TTL (30 s) and this.
    "sweep-presence": {"task": "approvals.tasks.sweep_presence", "schedule": 15.0},
    "refresh-tool-lists": {"task": "approvals.tasks.refresh_tool_lists", "schedule": 300.0},
    "clear-expired-sessions": {"task": "approvals.tasks.clear_expired_sessions", "schedule": 86400.0},
    # A call's requestState (a secret) is forgotten within a minute of the call's end.
    "forget-request-states": {"task": "approvals.tasks.forget_request_states", "schedule": 60.0},
}

# --- Elicit Hub ------------------------------------------------------------------------------------------

# How long a round waits for answers before beat expires it, and what expiry does by default:
# "cancel" resumes the call with cancel answers so the server ends the tool; "abandon" stops there.
ELICIT_ROUND_TTL = env_int("ELICIT_ROUND_TTL", 3600, minimum=10)
ELICIT_EXPIRY_POLICY = env_str("ELICIT_EXPIRY_POLICY", "cancel")
if ELICIT_EXPIRY_POLICY not in {"cancel", "abandon"}:
    raise ImproperlyConfigured("ELICIT_EXPIRY_POLICY must be cancel or abandon.")
# Bounded retries of transient MCP faults (connect, timeout, 5xx, 429), with exponential backoff + jitter.
ELICIT_MCP_MAX_RETRIES = env_int("ELICIT_MCP_MAX_RETRIES", 4)
ELICIT_MCP_RETRY_BASE = env_int("ELICIT_MCP_RETRY_BASE", 2, minimum=1)
ELICIT_MCP_RETRY_MAX = env_int("ELICIT_MCP_RETRY_MAX", 60, minimum=1)
# Each exchange with an MCP server (tools/list, server/discover) is bounded by ELICIT_MCP_TIMEOUT; a
# tools/call by its server's call_timeout or the tool's entry in tool_timeouts (default 600 s), capped here.
ELICIT_MCP_TIMEOUT = env_int("ELICIT_MCP_TIMEOUT", 30, minimum=1)
# Holder processes (manage.py run_holder): heartbeat and poll intervals, when a silent one is declared lost,
# and how many calls one holds at once.
ELICIT_HOLDER_HEARTBEAT = env_int("ELICIT_HOLDER_HEARTBEAT", 5, minimum=1)
ELICIT_HOLDER_POLL = env_int("ELICIT_HOLDER_POLL", 3, minimum=1)
ELICIT_HOLDER_STALE = env_int("ELICIT_HOLDER_STALE", 30, minimum=5)
ELICIT_HOLDER_MAX_CALLS = env_int("ELICIT_HOLDER_MAX_CALLS", 1000, minimum=1)
ELICIT_MAX_CALL_TIMEOUT = env_int("ELICIT_MAX_CALL_TIMEOUT", 3000, minimum=1)
# A worker sending a call keeps a lease on it in Redis, renewed every third of this many seconds, so that a
# worker whose PostgreSQL session (and the call's lock with it) was lost mid-send is not taken for dead
# (approvals.services.leases). A worker that dies lets its calls go this many seconds later.
ELICIT_SEND_LEASE = env_int("ELICIT_SEND_LEASE", 15, minimum=3, maximum=300)
# A run_call task lists tools and then waits for the call: its time limits sit above the longest allowed
# call (and below the broker's visibility timeout, system check approvals.E001). A task cut by the limit
# leaves its send claimed; the redelivered task re-sends it only when that is safe. (A send that used its
# whole limit and then waits for PostgreSQL to record its answer, sending.RECORD_PATIENCE, may be cut there.)
ELICIT_CALL_TASK_SOFT_TIME_LIMIT = ELICIT_MAX_CALL_TIMEOUT + 4 * ELICIT_MCP_TIMEOUT + 30
ELICIT_CALL_TASK_TIME_LIMIT = ELICIT_CALL_TASK_SOFT_TIME_LIMIT + 15
CELERY_TASK_ANNOTATIONS = {
    name: {"soft_time_limit": ELICIT_CALL_TASK_SOFT_TIME_LIMIT, "time_limit": ELICIT_CALL_TASK_TIME_LIMIT}
    for name in ("approvals.tasks.run_call", "approvals.tasks.resume_call")
}
# Beat probes each server again (era, tool list) once its tool list is older than this many seconds, at most
# ELICIT_TOOLS_REFRESH_BATCH servers per run (every 5 minutes).
ELICIT_TOOLS_REFRESH_INTERVAL = env_int("ELICIT_TOOLS_REFRESH_INTERVAL", 3600, minimum=60)
ELICIT_TOOLS_REFRESH_BATCH = env_int("ELICIT_TOOLS_REFRESH_BATCH", 50, minimum=1)
# stdio servers: the unprivileged user they run as when the hub runs as root, and the directory under which
# each gets its own working directory. A lease on one is taken over once its holder is ELICIT_HOLDER_STALE.
ELICIT_STDIO_USER = env_str("ELICIT_STDIO_USER", "nobody")
ELICIT_STDIO_DIR = Path(env_str("ELICIT_STDIO_DIR", str(engines.VAR_DIR / "stdio")))
ELICIT_WEBHOOK_MAX_ATTEMPTS = env_int("ELICIT_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1)
ELICIT_WEBHOOK_RETRY_MAX = env_int("ELICIT_WEBHOOK_RETRY_MAX", 600, minimum=1)
ELICIT_WEBHOOK_TIMEOUT = env_int("ELICIT_WEBHOOK_TIMEOUT", 10, minimum=1)
# Team notices (email, chat webhook) are retried with the webhooks' backoff, this many tries in all.
ELICIT_NOTIFY_MAX_ATTEMPTS = env_int("ELICIT_NOTIFY_MAX_ATTEMPTS", 5, minimum=1)
# Webhook targets must be https; development and tests may allow http to loopback.
ELICIT_WEBHOOK_ALLOW_HTTP = env_bool("ELICIT_WEBHOOK_ALLOW_HTTP", DEBUG)
# Outbound requests (callbacks, MCP servers, chat webhooks) go only to public addresses, and to the networks
# ("10.0.0.0/8", "::1") and host names ("deploy.internal", ".internal") listed here. Development and the
# tests allow loopback, where the demo MCP server and the test listeners run.
ELICIT_OUTBOUND_ALLOW = env_str("ELICIT_OUTBOUND_ALLOW", "127.0.0.0/8,::1" if DEBUG else "")
for _entry in filter(None, (item.strip() for item in ELICIT_OUTBOUND_ALLOW.split(","))):
    if "/" in _entry or ":" in _entry:
        try:
            ipaddress.ip_network(_entry.strip("[]"), strict=False)
        except ValueError:
            raise ImproperlyConfigured(f"ELICIT_OUTBOUND_ALLOW: {_entry!r} is not a network.") from None
ELICIT_LONG_POLL_MAX = 60
# The MCP gateway (`/mcp`, its own process): progress notifications while a call waits come this often
# (seconds); a tools/call request waits at most ELICIT_GATEWAY_MAX_WAIT s for its call to end (the call
# goes on after that); handshake-era sessions idle this long are closed, and at most this many are open.
ELICIT_GATEWAY_PROGRESS_INTERVAL = env_int("ELICIT_GATEWAY_PROGRESS_INTERVAL", 5, minimum=1)
ELICIT_GATEWAY_MAX_WAIT = env_int("ELICIT_GATEWAY_MAX_WAIT", 24 * 3600, minimum=1)
# A tools/call without an Idempotency-Key that repeats one of the agent's calls (same tool, same arguments)
# still open, or ended less than this many seconds ago, gets that call instead of a second execution.
ELICIT_GATEWAY_REPEAT_WINDOW = env_int("ELICIT_GATEWAY_REPEAT_WINDOW", 600, minimum=0)
ELICIT_GATEWAY_SESSION_IDLE = env_int("ELICIT_GATEWAY_SESSION_IDLE", 1800, minimum=10)
ELICIT_GATEWAY_MAX_SESSIONS = env_int("ELICIT_GATEWAY_MAX_SESSIONS", 1000, minimum=1)
# Handshake-era sessions one agent may hold at once in a gateway process; 0: a tenth of the above (min. 1).
ELICIT_GATEWAY_AGENT_SESSIONS = env_int("ELICIT_GATEWAY_AGENT_SESSIONS", 0, minimum=0)
# Clients told of tool list changes (notifications/tools/list_changed): a gateway reads at once when a change
# is signalled, and at least this often anyway (a change made without the signal, one lost with Redis).
ELICIT_GATEWAY_TOOLS_CHECK = env_int("ELICIT_GATEWAY_TOOLS_CHECK", 10, minimum=1, maximum=3600)
# The hub's own requestState, given to a 2026-07-28 client a question is passed through to, is refused
# this many seconds after it was made (the round's own deadline applies as well).
ELICIT_GATEWAY_STATE_TTL = env_int("ELICIT_GATEWAY_STATE_TTL", 3600, minimum=10)
# tools/list on the gateway answers in pages of at most this many tools (MCP's cursor / nextCursor).
ELICIT_GATEWAY_PAGE_SIZE = env_int("ELICIT_GATEWAY_PAGE_SIZE", 100, minimum=1)
# The dashboard suggests a grant for a tool whose gate a team approved at least ELICIT_GRANT_SUGGEST_APPROVALS
# times in the last ELICIT_GRANT_SUGGEST_DAYS days without declining it once.
ELICIT_GRANT_SUGGEST_APPROVALS = env_int("ELICIT_GRANT_SUGGEST_APPROVALS", 20, minimum=1)
ELICIT_GRANT_SUGGEST_DAYS = env_int("ELICIT_GRANT_SUGGEST_DAYS", 14, minimum=1)
# Where reviewers reach the dashboard; links in notices point here.
ELICIT_PUBLIC_URL = env_str("ELICIT_PUBLIC_URL", "http://127.0.0.1:8000")
try:
    _public = urlsplit(ELICIT_PUBLIC_URL)
    _public_ok = _public.scheme in {"http", "https"} and bool(_public.hostname) and _public.port != 0
except ValueError:  # a port that is not a number
    _public_ok = False
if not _public_ok or _public.query or _public.fragment:
    # Every link in an email or chat notice would be broken (hub.example.com/requests/5/ is no address).
    raise ImproperlyConfigured(
        "ELICIT_PUBLIC_URL must be the address reviewers open the dashboard at, such as "
        "https://hub.example.com (no query or fragment); links in notices start with it."
    )
# Notices go out this long before a round's deadline.
ELICIT_EXPIRY_WARNING = env_int("ELICIT_EXPIRY_WARNING", 600, minimum=0)

_MAIL = "django.core.mail.backends."
EMAIL_BACKEND = env_str(
    "DJANGO_EMAIL_BACKEND", _MAIL + ("console.EmailBackend" if DEBUG else "smtp.EmailBackend")
)
EMAIL_HOST = env_str("DJANGO_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("DJANGO_EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("DJANGO_EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("DJANGO_EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("DJANGO_EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DJANGO_DEFAULT_FROM_EMAIL", "elicit-hub@localhost")
# How long audit events are kept; only `manage.py prune_audit` removes them, recording what went.
ELICIT_AUDIT_RETENTION_DAYS = env_int("ELICIT_AUDIT_RETENTION_DAYS", 365, minimum=1)
# Audit exports per person ("count/period"): each is an event of its own and a read of the whole view.
ELICIT_AUDIT_EXPORT_RATE = env_rate("ELICIT_AUDIT_EXPORT_RATE", "60/h")
# Per token (agent or personal), e.g. "600/m"; past it the API answers 429 with Retry-After.
ELICIT_API_RATE = env_rate("ELICIT_API_RATE", "600/m")
# API requests with no valid token or session, per client address; past it 429 with Retry-After.
ELICIT_API_ANON_RATE = env_rate("ELICIT_API_ANON_RATE", "60/m")
# Failed sign-ins per user name and per client address ("count/period"); past either, every sign-in for
# that name or from that client is refused (429), the right password included, until the oldest failure
# is older than the period.
ELICIT_SIGN_IN_USER_RATE = env_rate("ELICIT_SIGN_IN_USER_RATE", "5/15m")
ELICIT_SIGN_IN_CLIENT_RATE = env_rate("ELICIT_SIGN_IN_CLIENT_RATE", "20/15m")
# Proxies in front of the hub that append the client's address to X-Forwarded-For: the limits above key on
# that address. 0 (the default) uses the socket's peer and ignores the header, which a client could forge.
NINJA_NUM_PROXIES = env_int("ELICIT_NUM_PROXIES", 0)
# What the hub accepts from outside (docs/api.md, "Limits"). A request body over ELICIT_MAX_BODY bytes is
# refused with 413 before it is parsed (Django's own limit is set to the same value); JSON nested deeper than
# ELICIT_MAX_JSON_DEPTH levels, or holding NaN/Infinity, NUL or lone surrogates, is refused with 400.
ELICIT_MAX_BODY = env_int("ELICIT_MAX_BODY", 1024 * 1024, minimum=1024)
# Seconds a client may take to send a request's line and headers, and may leave between two pieces of its
# body, before the API server answers 408 and closes the connection (a slow client held it open for ever).
ELICIT_CLIENT_TIMEOUT = env_int("ELICIT_CLIENT_TIMEOUT", 30, minimum=1, maximum=3600)
# At most 90: the audit log refuses event data nested deeper than 100 levels, and an event holds the
# arguments a few levels down.
ELICIT_MAX_JSON_DEPTH = env_int("ELICIT_MAX_JSON_DEPTH", 32, minimum=4, maximum=90)
DATA_UPLOAD_MAX_MEMORY_SIZE = ELICIT_MAX_BODY
# An answer form holds up to 100 fields of up to 500 options each (approvals.schema_forms): a reviewer who
# ticks them all posts 50,000 values, past Django's default of 1,000 fields, which answered 400 and lost the
# form. The body's size is still bounded by DATA_UPLOAD_MAX_MEMORY_SIZE.
DATA_UPLOAD_MAX_NUMBER_FIELDS = 100 * 500 + 500
# What the hub accepts from an MCP server. A round with more input requests, or an input request with a
# longer message or a bigger requestedSchema (compact JSON bytes), is declined to the server and shown as
# unsupported; a tool result over ELICIT_MAX_RESULT bytes is stored truncated, flagged, with its full size.
ELICIT_MAX_INPUT_REQUESTS = env_int("ELICIT_MAX_INPUT_REQUESTS", 50, minimum=1)
ELICIT_MAX_MESSAGE = env_int("ELICIT_MAX_MESSAGE", 10_000, minimum=100)
ELICIT_MAX_SCHEMA = env_int("ELICIT_MAX_SCHEMA", 64 * 1024, minimum=1024)
ELICIT_MAX_RESULT = env_int("ELICIT_MAX_RESULT", 1024 * 1024, minimum=1024)
# The most of one MCP server's JSON answer the hub reads (SSE answers: each of their events, raised from the
# SDK's 1 MiB); past it the read stops and the call fails "response_too_large". Above ELICIT_MAX_RESULT, whose
# results are kept truncated.
ELICIT_MAX_MCP_RESPONSE = env_int("ELICIT_MAX_MCP_RESPONSE", 16 * 1024 * 1024, minimum=64 * 1024)
# GET /api/v1/inbox answers at most this many items at once (``limit`` may ask for fewer).
ELICIT_INBOX_MAX = env_int("ELICIT_INBOX_MAX", 200, minimum=1)
# The queue page shows at most this many rounds, those that have waited longest (its count is of all).
ELICIT_QUEUE_MAX = env_int("ELICIT_QUEUE_MAX", 100, minimum=1)
ELICIT_DEMO_STATE_KEY = env_str("ELICIT_DEMO_STATE_KEY", "elicit-hub-demo-state-key-for-development-only")
ELICIT_DEMO_MCP_URL = env_str("ELICIT_DEMO_MCP_URL", "http://127.0.0.1:8765/mcp")

# The hub's log level (the root logger's): one of Python's level names, in any case.
ELICIT_LOG_LEVEL = env_str("ELICIT_LOG_LEVEL", "INFO").strip().upper()
if ELICIT_LOG_LEVEL not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
    raise ImproperlyConfigured(
        f"ELICIT_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, not {ELICIT_LOG_LEVEL[:40]!r}."
    )

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": ELICIT_LOG_LEVEL},
    "loggers": {
        # httpx logs every request line at INFO; the hub logs its own hops.
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
        # The SDK's transport logs a server's whole URL (a key in its query too) at DEBUG, and the session id
        # a server gives (with which anyone could send on the hub's session) at INFO: neither, whatever
        # ELICIT_LOG_LEVEL says.
        "mcp.client.streamable_http": {"level": "WARNING"},
    },
}
