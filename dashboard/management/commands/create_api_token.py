"""``manage.py create_api_token USER [--hours N]``: print a new API token of USER (shown this once; only its digest
is stored). Same token as ``POST /api/v1/auth-token/``, without the password."""
from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from knox.settings import knox_settings

from dashboard.api.tokens import create_token


class Command(BaseCommand):
    help = ("Create an API token for a user and print it (the only time it is shown). It expires after --hours "
            "(default: KVPOOL_API_TOKEN_TTL_HOURS).")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--hours", type=int, default=None,
                            help="Hours until the token expires (at least 1); default KVPOOL_API_TOKEN_TTL_HOURS.")

    def handle(self, *args, username: str, hours: int | None, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named '{username}'.")
        if not user.is_active:
            raise CommandError(f"User '{username}' is inactive: an API token of it would not work.")
        if hours is not None and hours < 1:
            raise CommandError(f"--hours must be at least 1, got {hours}.")
        ttl = timedelta(hours=hours) if hours is not None else knox_settings.TOKEN_TTL
        instance, token = create_token(user, ttl)
        self.stderr.write(f"API token {instance.token_key}... of {username}, expires {instance.expiry:%Y-%m-%d %H:%M} "
                          "UTC; it is not shown again:")
        self.stdout.write(token)
