"""How API requests authenticate: django-rest-knox 5's ``Authorization: Token <token>`` (``TokenAuthentication``)
and Django's session (``REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]``).

This module must not import ``rest_framework.views``: DRF reads the authentication classes while it defines
``APIView``.
"""
from __future__ import annotations

from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from rest_framework import exceptions


class TokenAuthentication(KnoxTokenAuthentication):
    """Knox's token authentication, answering a token that is not ASCII with knox's "Invalid token." (HTTP 401).

    Knox decodes the token as UTF-8, and a header byte that is not valid UTF-8 (headers arrive as Latin-1)
    raised ``UnicodeDecodeError``: any anonymous request could produce an HTTP 500. Tokens are hex digits.
    """

    def authenticate_credentials(self, token: bytes):
        if not token.isascii():
            raise exceptions.AuthenticationFailed("Invalid token.")
        return super().authenticate_credentials(token)
