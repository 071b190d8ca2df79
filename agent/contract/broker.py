"""The broker URL both sides accept (``kvpool-agent run --broker``, the dashboard's ``CELERY_BROKER_URL``) and the
Redis ACL of each agent's broker user (:func:`agent_acl_rules`); no Django.

:func:`broker_url` raises ``argparse.ArgumentTypeError`` with the offending text, so an argparse ``type=`` prints
``error: --broker: ...`` and exits 2 instead of a traceback; the dashboard turns it into a configuration error.
"""
from __future__ import annotations

import argparse
from urllib.parse import urlsplit

from agent.contract.messages import INGEST_QUEUE, node_queue

#: Broker URL schemes the agent's Celery/kombu set-up supports (``memory://`` only for tests).
BROKER_SCHEMES: tuple[str, ...] = ("redis", "rediss", "memory")


def broker_url(text: str, schemes: tuple[str, ...] = BROKER_SCHEMES) -> str:
    """A broker URL with one of ``schemes`` and a host (``memory://`` needs none); returned unchanged.

    Without this check kombu fails later with ``KeyError: No such transport`` (unknown scheme) or reads a bare
    word as ``amqp://WORD:5672`` and retries forever.
    """
    try:
        parts = urlsplit(text)
        hostname = parts.hostname
        parts.port  # noqa: B018  (raises ValueError on a non-numeric or out-of-range port)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid URL: {exc}") from None
    allowed = ", ".join(f"{scheme}://" for scheme in schemes)
    if "://" not in text or parts.scheme.lower() not in schemes:
        raise argparse.ArgumentTypeError(f"{text!r} is not a supported broker URL (use {allowed}, "
                                         "e.g. redis://127.0.0.1:6379/0)")
    if parts.scheme.lower() != "memory" and not hostname:
        raise argparse.ArgumentTypeError(f"{text!r} names no host (e.g. redis://127.0.0.1:6379/0)")
    db = parts.path.strip("/")
    if parts.scheme.lower() in ("redis", "rediss") and db and not (db.isascii() and db.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: the Redis database {db!r} is not a number "
                                         "(e.g. redis://127.0.0.1:6379/0)")
    return text


#: Redis commands an agent's Celery worker and publisher send (kombu 5.x Redis transport with the agent's
#: ``broker_transport_options``: no ack emulation, one priority step, no remote control, no events), seen with
#: ``MONITOR`` on Redis 7.0: connection set-up, its own queue's declaration, ``BRPOP`` on it, ``LPUSH`` of
#: telemetry and purge results (``declare=[]``: no binding-set write on the dashboard's queues), requeue on a warm
#: shutdown.
AGENT_COMMANDS = ("ping", "hello", "auth", "select", "multi", "exec", "discard", "brpop", "lpush", "rpush", "llen",
                  "sadd", "smembers")


def agent_acl_rules(node: str) -> list[str]:
    """``ACL SETUSER`` rules (Redis 7) of the broker user of ``node``'s agent, without ``on`` and the password: it
    may read and write its own queue ``agent.<node>`` and that queue's kombu binding sets, and only **push** to
    ``dashboard.ingest`` (acks, reports, heartbeats and purge results); no other key, no Pub/Sub channel, no other
    command. So another node's credentials can neither read this node's documents nor write into its queue, nor
    push to ``dashboard.control``, where the dashboard runs its own tasks (config pushes, quota syncs); on
    ``dashboard.ingest`` the dashboard's worker runs only the agents' tasks (``dashboard.task_queues``). ``SELECT``
    stays allowed (a broker URL may name a database): ACL key patterns hold in every database.

    Example: ``redis-cli ACL SETUSER agent-node-a on '>PASSWORD' <rules...>``, then the agent runs with
    ``--broker redis://agent-node-a:PASSWORD@host:6379/0``. Raises ``ValueError`` for a name with whitespace.
    """
    if not node or any(ch.isspace() for ch in node):
        raise ValueError(f"node name {node!r} cannot name a Redis ACL key")
    queue = node_queue(node)
    return ["resetkeys", "resetchannels", "-@all", *(f"+{cmd}" for cmd in AGENT_COMMANDS),
            f"~{queue}", f"~_kombu.binding.{queue}", f"~_kombu.binding_permanent.{queue}",
            f"%W~{INGEST_QUEUE}"]
