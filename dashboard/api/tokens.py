"""API tokens (django-rest-knox 5): stored as SHA-512 digests only, shown once when created, expiring after
``REST_KNOX["TOKEN_TTL"]`` (``KVPOOL_API_TOKEN_TTL_HOURS``), revoked one by one.

Routes (under ``/api/v1/``):
  ``auth-token/``            ``POST {"username", "password"}`` -> ``{"token", "token_key", "expiry"}``: a new token
                             of that user (the only time it is shown). Throttled per client address (``auth-token``
                             rate, HTTP 429), and a username + address locked by django-axes after repeated wrong
                             passwords answers HTTP 429 until the cool-off ends, the right password included.
  ``tokens/``                ``GET``: the caller's tokens — ``token_key`` (the token's first 15 characters),
                             ``created``, ``expiry`` — never the tokens themselves
  ``tokens/<token_key>/``    ``DELETE``: revoke that token of the caller (it stops working at once)

Send a token as ``Authorization: Token <token>``. ``manage.py create_api_token USER`` and
``manage.py revoke_api_tokens USER`` do the same from a shell; platform admins also revoke in the Django admin.
"""
from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import authenticate, user_logged_in
from django.http import Http404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from knox.models import AuthToken
from knox.settings import knox_settings
from rest_framework import generics, serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from dashboard.views.accounts import lockout_detail


def create_token(user, ttl: timedelta | None = None) -> tuple[AuthToken, str]:
    """A new API token of ``user`` expiring after ``ttl`` (default ``REST_KNOX["TOKEN_TTL"]``): ``(stored row,
    token)``. The row holds only the token's digest and first 15 characters; the token itself exists only in the
    return value. Deletes the user's expired tokens first (requests delete only the expired token they send, see
    :class:`dashboard.api.authentication.TokenAuthentication`)."""
    AuthToken.objects.filter(user=user, expiry__lt=timezone.now()).delete()
    return AuthToken.objects.create(user=user, expiry=ttl if ttl is not None else knox_settings.TOKEN_TTL)


class TokenRequestSerializer(serializers.Serializer):
    """Body of ``POST auth-token/``."""

    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=4096, trim_whitespace=False, write_only=True,
                                     style={"input_type": "password"})


class NewTokenSerializer(serializers.Serializer):
    """A token just created: shown this once (only its digest is stored)."""

    token = serializers.CharField(help_text="Send as 'Authorization: Token <token>'. Not shown again.")
    token_key = serializers.CharField(help_text="The token's first 15 characters: names it in tokens/.")
    expiry = serializers.DateTimeField(allow_null=True, help_text="When the token stops working.")


class TokenSerializer(serializers.ModelSerializer):
    """One of the caller's tokens, without the token."""

    class Meta:
        model = AuthToken
        fields = ("token_key", "created", "expiry")
        read_only_fields = fields


class ObtainToken(APIView):
    """``POST auth-token/``: a username and password in, a new API token out (see the module docstring)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "auth-token"

    # 400 (a wrong username or password: non_field_errors) and 429 are documented by dashboard.api.schema.
    @extend_schema(request=TokenRequestSerializer, responses={200: NewTokenSerializer})
    def post(self, request: Request) -> Response:
        """Create an API token with a username and password; the answer is the only time the token is shown."""
        body = TokenRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        http = request._request  # django-axes reads and marks the Django request (address, lockout flag)
        user = authenticate(http, username=body.validated_data["username"],
                            password=body.validated_data["password"])
        if user is None:
            if getattr(http, "axes_locked_out", False):
                return Response({"detail": lockout_detail()}, status=status.HTTP_429_TOO_MANY_REQUESTS)
            raise serializers.ValidationError({"non_field_errors": ["Unable to log in with provided credentials."]})
        instance, token = create_token(user)
        user_logged_in.send(sender=type(user), request=http, user=user)  # last_login; axes resets the failures
        data = NewTokenSerializer({"token": token, "token_key": instance.token_key, "expiry": instance.expiry}).data
        return Response(data, headers={"Cache-Control": "no-store"})


class TokenList(generics.ListAPIView):
    """``GET tokens/``: the caller's API tokens (never the tokens themselves), newest first."""

    serializer_class = TokenSerializer
    filter_backends: list = []
    queryset = AuthToken.objects.none()  # the schema's model; requests list the caller's own

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular building the schema: no user
            return self.queryset
        return AuthToken.objects.filter(user=self.request.user).order_by("-created")


class TokenRevoke(APIView):
    """``DELETE tokens/<token_key>/``: revoke one of the caller's tokens (HTTP 404 when the caller has none with
    that key)."""

    @extend_schema(responses={204: None})
    def delete(self, request: Request, token_key: str) -> Response:
        deleted, _ = AuthToken.objects.filter(user=request.user, token_key=token_key).delete()
        if not deleted:
            raise Http404("You have no API token with that token_key.")
        return Response(status=status.HTTP_204_NO_CONTENT)
