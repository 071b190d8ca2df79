#!/usr/bin/env bash
# Starts Redis and PostgreSQL on their standard local ports when they are down (as CI's machine does at boot).
set -uo pipefail
if ! (redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG); then
  if command -v redis-server >/dev/null; then
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log && echo "started redis-server on 127.0.0.1:6379"
  else
    echo "warning: Redis is down on 127.0.0.1:6379 and redis-server is not installed" >&2
  fi
fi
if [ -n "${DATABASE_URL:-}" ] && [[ "$DATABASE_URL" == postgres* ]]; then
  if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    if command -v pg_ctlcluster >/dev/null; then
      pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start && echo "started PostgreSQL"
      for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
    else
      echo "error: PostgreSQL is down on 127.0.0.1:5432 and pg_ctlcluster is not installed" >&2
      exit 1
    fi
  fi
fi
exit 0
