"""Web search APIs as small adapters: how to ask each one for a query, and how its documented JSON
answer becomes our passages. Pure functions (no I/O, no logging), so each adapter is tested on bytes.

| provider | request                                                     | results in                     |
|----------|-------------------------------------------------------------|--------------------------------|
| serper   | POST {base}/search, JSON {"q", "num"}, header X-API-KEY     | "organic": [{title, link, snippet, position}] |
| serpapi  | GET {base}/search.json?engine=google&q&num&api_key          | "organic_results": [{title, link, snippet, position}] |
| brave    | GET {base}/res/v1/web/search?q&count, X-Subscription-Token  | "web": {"results": [{title, url, description}]} |
| searxng  | GET {base}/search?q&format=json                             | "results": [{title, url, content, score}] |

A result becomes a passage the way Search-R1's online search server builds one: `contents` is
`"{title}"\\n{snippet}` (title on the first line, as wiki-18 rows have it), the URL is the passage id,
and the score is 1/rank (rank 1 is the provider's first result), since the APIs give no comparable
relevance score. HTML markup in a title or snippet (Brave marks matches with `<strong>`) is removed and
entities are decoded. A title or snippet longer than the configured bound is cut (and counted).

What counts as bad input, and what happens to it: a body that is not JSON, or JSON without the
provider's result list (an HTML error page, `{"error": ...}`), raises `MalformedResponse`; a result
without a URL or without both title and snippet is skipped and counted as `missing_fields`.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Provider = Literal["serper", "serpapi", "brave", "searxng"]
"""The web search APIs an adapter exists for."""

DEFAULT_BASE_URLS: dict[str, str] = {
    "serper": "https://google.serper.dev",
    "serpapi": "https://serpapi.com",
    "brave": "https://api.search.brave.com",
    "searxng": "http://127.0.0.1:8080",
}
"""Each provider's public endpoint (SearXNG is self-hosted: its usual local address)."""

TAG = re.compile(r"<[^>]{0,200}>")
SPACE = re.compile(r"\s+")


class MalformedResponse(ValueError):
    """A provider answer that is not the documented JSON (an HTML page, a JSON error, no result list)."""


@dataclass(frozen=True, slots=True)
class WebRequest:
    """One HTTP request to a provider. `secret` is the API key the request carries (for redaction)."""

    method: Literal["GET", "POST"]
    url: str
    params: dict[str, str] = field(default_factory=dict)
    json: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    secret: str | None = None


@dataclass(frozen=True, slots=True)
class WebResult:
    """One search result as a passage."""

    url: str
    """The page URL, used as the passage id."""
    title: str
    """The page title (markup removed)."""
    contents: str
    """`"{title}"\\n{snippet}`, the shape of a wiki-18 row."""
    score: float
    """1/rank."""


@dataclass
class Parsed:
    """A provider answer turned into results, with what had to be repaired along the way."""

    results: list[WebResult]
    skipped: int = 0
    """Results dropped for missing fields."""
    truncated: int = 0
    """Titles or snippets cut to the bound."""


def build_request(provider: Provider, base_url: str, query: str, num: int, api_key: str | None) -> WebRequest:
    """The request that asks `provider` for the top `num` results of `query`."""
    base = base_url.rstrip("/")
    if provider == "serper":
        return WebRequest("POST", f"{base}/search", json={"q": query, "num": num},
                          headers={"X-API-KEY": api_key or "", "Content-Type": "application/json"}, secret=api_key)
    if provider == "serpapi":
        return WebRequest("GET", f"{base}/search.json", params={"engine": "google", "q": query, "num": str(num),
                                                                "api_key": api_key or ""}, secret=api_key)
    if provider == "brave":
        return WebRequest("GET", f"{base}/res/v1/web/search", params={"q": query, "count": str(min(num, 20))},
                          headers={"X-Subscription-Token": api_key or "", "Accept": "application/json"},
                          secret=api_key)
    if provider == "searxng":
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        return WebRequest("GET", f"{base}/search", params={"q": query, "format": "json"}, headers=headers,
                          secret=api_key)
    raise ValueError(f"unknown provider {provider!r}")


def clean_text(value: Any, max_chars: int) -> tuple[str, bool]:
    """A provider string without markup, entities decoded, whitespace collapsed, cut to `max_chars`
    (returns the text and whether it was cut). Non-strings become ""."""
    if not isinstance(value, str):
        return "", False
    if len(value) > 8 * max_chars:  # bound the regex work on a huge field before cleaning it
        value = value[:8 * max_chars]
    text = SPACE.sub(" ", html.unescape(TAG.sub("", value))).strip()
    if len(text) > max_chars:
        return text[:max_chars].rstrip(), True
    return text, False


def _list_at(data: Any, *path: str) -> list[Any]:
    for key in path:
        if not isinstance(data, Mapping) or key not in data:
            error = data.get("error") if isinstance(data, Mapping) else None
            raise MalformedResponse(f"no {'.'.join(path)} in the answer" + (f" (error: {error!s:.200})" if error
                                                                           else ""))
        data = data[key]
    if not isinstance(data, list):
        raise MalformedResponse(f"{'.'.join(path)} is {type(data).__name__}, not a list")
    return data


def _items(provider: Provider, data: Any) -> list[tuple[Any, Any, Any]]:
    """(url, title, snippet) of each result, in the provider's order."""
    if provider == "serper":
        return [(r.get("link"), r.get("title"), r.get("snippet")) if isinstance(r, Mapping) else (None,) * 3
                for r in _list_at(data, "organic")]
    if provider == "serpapi":
        return [(r.get("link"), r.get("title"), r.get("snippet")) if isinstance(r, Mapping) else (None,) * 3
                for r in _list_at(data, "organic_results")]
    if provider == "brave":
        if isinstance(data, Mapping) and "web" not in data and data.get("type") == "search":
            return []  # Brave leaves out "web" when nothing matched
        return [(r.get("url"), r.get("title"), r.get("description")) if isinstance(r, Mapping) else (None,) * 3
                for r in _list_at(data, "web", "results")]
    if provider == "searxng":
        return [(r.get("url"), r.get("title"), r.get("content")) if isinstance(r, Mapping) else (None,) * 3
                for r in _list_at(data, "results")]
    raise ValueError(f"unknown provider {provider!r}")


def parse_response(provider: Provider, body: bytes, top_k: int, *, max_title_chars: int,
                   max_snippet_chars: int) -> Parsed:
    """A provider's answer body → its first `top_k` usable results as passages (see the module docstring),
    titles and snippets cut to `[retriever.web]`'s `max_title_chars` and `max_snippet_chars`."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        start = body[:40].decode("utf-8", "replace").strip()
        raise MalformedResponse(f"not JSON ({exc.__class__.__name__}); starts {start!r}") from None
    out = Parsed([])
    for url, raw_title, raw_snippet in _items(provider, data):
        if len(out.results) >= top_k:
            break
        title, cut_title = clean_text(raw_title, max_title_chars)
        snippet, cut_snippet = clean_text(raw_snippet, max_snippet_chars)
        if not isinstance(url, str) or not url.strip() or not (title or snippet):
            out.skipped += 1
            continue
        out.truncated += int(cut_title) + int(cut_snippet)
        rank = len(out.results) + 1
        out.results.append(WebResult(url.strip(), title, f'"{title}"\n{snippet}', 1.0 / rank))
    return out

