"""How API requests authenticate: django-rest-knox 5's ``Authorization: Token <token>`` (``TokenAuthentication``)
and Django's session (``REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]``).

This module must not import ``rest_framework.views``: DRF reads the authentication classes while it defines
``APIView``.
"""
from __future__ import annotations

from django.utils import timezone
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.signals import token_expired
from rest_framework import exceptions


class TokenAuthentication(KnoxTokenAuthentication):
    """Knox's token authentication, answering a token that is not ASCII with knox's "Invalid token." (HTTP 401).

    Knox decodes the token as UTF-8, and a header byte that is not valid UTF-8 (headers arrive as Latin-1)
    raised ``UnicodeDecodeError``: any anonymous request could produce an HTTP 500. Tokens are hex digits.

    A request costs one query (the token rows with the sent token's ``token_key``, with their user): knox's
    ``_cleanup_token`` also read every token of the user on every request to delete the expired ones, a second
    query per request that grows with the user's tokens. Here an expired token is still refused and deleted when
    it is sent; the user's other expired tokens are deleted when the user gets a new token
    (:func:`dashboard.api.tokens.create_token`, one ``DELETE``).
    """

    def authenticate_credentials(self, token: bytes):
        if not token.isascii():
            raise exceptions.AuthenticationFailed("Invalid token.")
        return super().authenticate_credentials(token)

    def _cleanup_token(self, auth_token) -> bool:
        """True (and ``auth_token`` deleted, knox's ``token_expired`` sent) when ``auth_token`` has expired."""
        if auth_token.expiry is not None and auth_token.expiry < timezone.now():
            username = auth_token.user.get_username()
            auth_token.delete()
            token_expired.send(sender=self.__class__, username=username, source="auth_token")
            return True
        return False
