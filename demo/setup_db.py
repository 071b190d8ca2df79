"""``python -m demo.setup_db --username U --password P``: migrate the demo database, create the superuser and
its REST API token; prints ``{"username": ..., "token": ...}`` as the last stdout line.

Runs with the demo's Django settings (``DJANGO_SETTINGS_MODULE=demo.settings`` and the demo's
``DATABASE_URL``), in one interpreter so Django starts once.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m demo.setup_db`` argument parser."""
    parser = argparse.ArgumentParser(prog="python -m demo.setup_db")
    parser.add_argument("--username", required=True)
    parser.add_argument("--password", required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Migrate, create (or reset) the superuser, print its token."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from dashboard.api.tokens import create_token

    call_command("migrate", interactive=False, verbosity=0)
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=args.username,
                                               defaults={"email": f"{args.username}@localhost"})
    user.is_staff = user.is_superuser = True
    user.set_password(args.password)
    user.save()
    _, token = create_token(user)  # a new API token each run: only its digest is stored
    print(json.dumps({"username": user.username, "token": token}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
