"""HTTP clients of the dashboard: the REST API with a token, and a logged-in browser-like session.

Standard library only (``urllib``). Every error names the method, the path, the HTTP status and the body the
dashboard returned (its 400s name the offending field).
"""
from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from html import unescape as html_unescape
from typing import Any


class ApiError(RuntimeError):
    """A request to the dashboard failed; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class RestClient:
    """``/api/v1/`` with ``Authorization: Token <token>``.

    Args:
        base_url: ``http://127.0.0.1:8000`` (no trailing slash needed).
        token: an API token (django-rest-knox; ``None`` for :meth:`obtain_token` only).
        timeout: seconds per request.
    """

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 20.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def url(self, path: str, params: Mapping[str, Any] | None = None) -> str:
        """Absolute URL of an API ``path`` (relative to ``/api/v1/``) with query ``params``."""
        url = f"{self.base_url}/api/v1/{path.lstrip('/')}"
        if params:
            url += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        return url

    def request(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        """Send one request; returns the decoded JSON (None for an empty body).

        Raises:
            ApiError: no answer, or a status >= 400 (message with the body).
        """
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Token {self.token}"
        req = urllib.request.Request(self.url(path, params), data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:2000]
            raise ApiError(f"{method} /api/v1/{path} -> HTTP {exc.code}: {detail}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(f"{method} /api/v1/{path}: no answer ({getattr(exc, 'reason', exc)})") from None
        return json.loads(raw) if raw else None

    def get(self, path: str, **params: Any) -> Any:
        """GET ``path`` with query ``params``."""
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any) -> Any:
        """POST JSON ``body`` to ``path``."""
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        """PATCH JSON ``body`` to ``path``."""
        return self.request("PATCH", path, body)

    def iterate(self, path: str, *, page: int = 500, **params: Any) -> Iterator[dict[str, Any]]:
        """Every result of a paginated list (``limit``/``offset``)."""
        offset = 0
        while True:
            data = self.get(path, limit=page, offset=offset, **params)
            results = data["results"] if isinstance(data, dict) else data
            yield from results
            if not isinstance(data, dict) or not data.get("next") or not results:
                return
            offset += len(results)

    def obtain_token(self, username: str, password: str) -> str:
        """``POST auth-token/`` with a username and password; stores and returns the token."""
        self.token = None
        self.token = self.post("auth-token/", {"username": username, "password": password})["token"]
        return self.token


class BrowserSession:
    """A logged-in session (cookies + CSRF) for the dashboard's pages and their JSON views.

    Raises:
        ApiError: the login form refused the credentials or the server did not answer.
    """

    def __init__(self, base_url: str, username: str, password: str, *, timeout: float = 20.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._jar = http.cookiejar.CookieJar()
        self._opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self._jar))
        self._login(username, password)

    def _open(self, path: str, data: bytes | None = None, headers: Mapping[str, str] | None = None) -> tuple[int, str]:
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, headers=dict(headers or {}))
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except (urllib.error.URLError, OSError) as exc:
            raise ApiError(f"GET {path}: no answer ({getattr(exc, 'reason', exc)})") from None

    def _login(self, username: str, password: str) -> None:
        status, html = self._open("/accounts/login/")
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
        if status != 200 or not match:
            raise ApiError(f"GET /accounts/login/ -> HTTP {status}: no login form", status)
        form = urllib.parse.urlencode({"username": username, "password": password,
                                       "csrfmiddlewaretoken": match.group(1), "next": "/"}).encode()
        status, html = self._open("/accounts/login/", form, {"Referer": f"{self.base_url}/accounts/login/",
                                                             "Content-Type": "application/x-www-form-urlencoded"})
        if status != 200 or 'name="password"' in html:
            raise ApiError(f"login as {username!r} was refused (HTTP {status})", status)

    def post_form(self, path: str, fields: Mapping[str, Any]) -> tuple[int, str, list[tuple[str, str]]]:
        """POST a page's form (``fields`` plus the CSRF token of the session's cookie), following the redirect.

        Returns ``(status, html, messages)``: the final page's status and HTML, and the messages it shows as
        ``(level, text)`` (``success``, ``error``, ...). Unchecked checkboxes are simply left out of ``fields``.

        Raises:
            ApiError: the server did not answer, or the session has no CSRF cookie.
        """
        token = next((cookie.value for cookie in self._jar if cookie.name == "csrftoken"), None)
        if token is None:
            raise ApiError(f"POST {path}: the session has no csrftoken cookie")
        form = urllib.parse.urlencode({**{k: v for k, v in fields.items() if v is not None},
                                       "csrfmiddlewaretoken": token}).encode()
        status, html = self._open(path, form, {"Referer": f"{self.base_url}{path}",
                                               "Content-Type": "application/x-www-form-urlencoded"})
        found = [(level.split()[-1] if level.split() else "", _unescape(text.strip()))
                 for level, text in re.findall(r'<li class="([^"]*)">(.*?)</li>', _messages_block(html), re.S)]
        return status, html, found

    def get_json(self, path: str) -> Any:
        """GET a JSON view of the pages (e.g. ``/checks/data.json``).

        Raises:
            ApiError: a status other than 200, or a body that is not JSON.
        """
        status, body = self._open(path, headers={"Accept": "application/json"})
        if status != 200:
            raise ApiError(f"GET {path} -> HTTP {status}: {body[:500]}", status)
        try:
            return json.loads(body)
        except ValueError:
            raise ApiError(f"GET {path}: not JSON: {body[:200]!r}", status) from None


def _messages_block(html: str) -> str:
    """The ``<ul class="messages">`` list of a page (``templates/base.html``), "" when it shows none."""
    match = re.search(r'<ul class="messages">(.*?)</ul>', html, re.S)
    return match.group(1) if match else ""


def _unescape(text: str) -> str:
    return html_unescape(re.sub(r"<[^>]+>", "", text))
