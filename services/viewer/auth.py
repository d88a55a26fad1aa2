"""The viewer's auth: the services' bearer token (`searchr1.core.auth`), made usable from a browser. A
request with `?token=<token>` gets the token set as an HTTP-only cookie and is redirected to the same page
without it; later requests carry the cookie, which this middleware turns into the `Authorization` header
`BearerAuthMiddleware` checks."""

from __future__ import annotations

from collections.abc import Callable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

from searchr1.core.auth import BearerAuthMiddleware, open_paths, token_matches

COOKIE = "searchr1_viewer_token"


class CookieTokenMiddleware:
    """Outermost layer: `?token=` → cookie + redirect; cookie → `Authorization: Bearer` header."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = BearerAuthMiddleware(app, token, open_paths(metrics_open=True))
        self.token = token

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = [v for k, v in query if k == "token"]
        if given and token_matches(f"Bearer {given[-1]}", self.token):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            location = scope.get("path", "/") + (f"?{rest}" if rest else "")
            cookie = f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/"
            await send({"type": "http.response.start", "status": 303,
                        "headers": [(b"location", location.encode("latin-1")), (b"set-cookie", cookie.encode())]})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = list(scope.get("headers", []))
        if not any(name == b"authorization" for name, _ in headers):
            for name, value in headers:
                if name == b"cookie":
                    morsel = SimpleCookie(value.decode("latin-1")).get(COOKIE)
                    if morsel is not None:
                        headers.append((b"authorization", f"Bearer {morsel.value}".encode("latin-1")))
                        scope = {**scope, "headers": headers}
                    break
        await self.app(scope, receive, send)
