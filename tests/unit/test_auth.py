"""Bearer-token auth: header parsing and the ASGI middleware."""

from __future__ import annotations

import httpx
import pytest

from searchr1.core.auth import BearerAuthMiddleware, grpc_metadata, http_headers, token_matches


@pytest.mark.parametrize(
    ("header", "ok"),
    [("Bearer s3cret", True), ("bearer s3cret", True), ("Bearer  s3cret ", True), ("Bearer wrong", False),
     ("Basic s3cret", False), ("s3cret", False), ("", False), (None, False), ("Bearer", False)],
)
def test_token_matches(header, ok):
    assert token_matches(header, "s3cret") is ok


def test_client_helpers():
    assert http_headers(None) == {} and grpc_metadata("") == ()
    assert http_headers("t") == {"Authorization": "Bearer t"}
    assert grpc_metadata("t") == (("authorization", "Bearer t"),)


async def _ok_app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_middleware_guards_all_but_open_paths():
    app = BearerAuthMiddleware(_ok_app, "s3cret")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.post("/v1/score")).status_code == 401
        assert (await c.post("/v1/score", headers={"Authorization": "Bearer nope"})).status_code == 401
        r = await c.post("/v1/score", headers=http_headers("s3cret"))
        assert r.status_code == 200 and r.text == "ok"
        assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/metrics")).status_code == 200
        assert (await c.get("/healthcheck")).status_code == 401  # prefix match is per path segment


def test_empty_token_refused():
    with pytest.raises(ValueError):
        BearerAuthMiddleware(_ok_app, "")
