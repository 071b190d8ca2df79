"""``manage.py revoke_api_tokens USER [--key TOKEN_KEY]``: revoke every API token of USER, or the one whose first
15 characters are TOKEN_KEY (``GET /api/v1/tokens/`` lists them). A revoked token stops working at once."""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from knox.models import AuthToken


class Command(BaseCommand):
    help = "Revoke a user's API tokens: all of them, or the one named by --key (its first 15 characters)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--key", default=None, help="token_key: the first 15 characters of the token to revoke.")

    def handle(self, *args, username: str, key: str | None, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named '{username}'.")
        tokens = AuthToken.objects.filter(user=user)
        if key is not None:
            tokens = tokens.filter(token_key=key)
        deleted, _ = tokens.delete()
        if key is not None and not deleted:
            raise CommandError(f"User '{username}' has no API token with token_key '{key}'.")
        self.stdout.write(f"Revoked {deleted} API token(s) of {username}.")
