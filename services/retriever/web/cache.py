"""The web backend's answer cache, keyed by provider, result count and normalised query, so the G
trajectories of a group and later epochs asking the same question pay for it once.

Two stores behind one small interface: Redis (`SET … EX ttl`, shared by every replica; the system already
runs it) and a SQLite file for `searchr1 up` without Redis (expired rows are skipped when read and
purged on start). A value is JSON (`[[url, title, contents, score], …]`), never pickle. A store that
fails (Redis away, a locked file) is a miss, not a failed search: the caller counts it and carries on.

Normalisation (`normalize_query`): Unicode NFKC, case folded, whitespace collapsed and stripped. Web
engines ignore case and spacing, so "Capital of France" and " capital  of france" share one entry;
punctuation is kept (it can change a web engine's answer: `c++` vs `c`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time
import unicodedata
from pathlib import Path
from typing import Protocol

from searchr1.retriever.web.adapters import WebResult


def normalize_query(query: str) -> str:
    """The cache's view of a query (see the module docstring)."""
    return " ".join(unicodedata.normalize("NFKC", query).casefold().split())


def cache_key(provider: str, num: int, query: str) -> str:
    """`{provider}:{num}:{sha256 of the normalised query}` (fixed length whatever the query)."""
    digest = hashlib.sha256(normalize_query(query).encode("utf-8")).hexdigest()
    return f"{provider}:{num}:{digest}"


def encode_results(results: list[WebResult]) -> bytes:
    return json.dumps([[r.url, r.title, r.contents, r.score] for r in results], ensure_ascii=False).encode()


def decode_results(blob: bytes | str) -> list[WebResult] | None:
    """The cached results, or None when the entry is not what `encode_results` writes (treated as a miss)."""
    try:
        rows = json.loads(blob)
        return [WebResult(str(u), str(t), str(c), float(s)) for u, t, c, s in rows]
    except (ValueError, TypeError):
        return None


class Cache(Protocol):
    async def get(self, key: str) -> list[WebResult] | None: ...

    async def put(self, key: str, results: list[WebResult]) -> None: ...

    async def close(self) -> None: ...


class RedisCache:
    """Entries under `{prefix}{key}` with a TTL (`close()` closes the client when `owns_client`)."""

    def __init__(self, client, prefix: str, ttl_s: int, *, owns_client: bool = False) -> None:
        self.client, self.prefix, self.ttl_s, self.owns_client = client, prefix, ttl_s, owns_client

    async def get(self, key: str) -> list[WebResult] | None:
        blob = await self.client.get(self.prefix + key)
        return None if blob is None else decode_results(blob)

    async def put(self, key: str, results: list[WebResult]) -> None:
        await self.client.set(self.prefix + key, encode_results(results), ex=self.ttl_s)

    async def close(self) -> None:
        if self.owns_client:
            await self.client.aclose()


class SqliteCache:
    """Entries in one SQLite file (one connection, used from worker threads one call at a time)."""

    def __init__(self, path: Path, ttl_s: int, *, clock=time.time) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.ttl_s, self.clock = ttl_s, clock
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS web_cache (key TEXT PRIMARY KEY, value BLOB, expires REAL)")
        self._db.execute("DELETE FROM web_cache WHERE expires < ?", (clock(),))
        self._lock = asyncio.Lock()

    def _get(self, key: str) -> bytes | None:
        row = self._db.execute("SELECT value FROM web_cache WHERE key = ? AND expires >= ?",
                               (key, self.clock())).fetchone()
        return None if row is None else row[0]

    def _put(self, key: str, blob: bytes) -> None:
        self._db.execute("INSERT OR REPLACE INTO web_cache VALUES (?, ?, ?)", (key, blob, self.clock() + self.ttl_s))

    async def get(self, key: str) -> list[WebResult] | None:
        async with self._lock:
            blob = await asyncio.to_thread(self._get, key)
        return None if blob is None else decode_results(blob)

    async def put(self, key: str, results: list[WebResult]) -> None:
        async with self._lock:
            await asyncio.to_thread(self._put, key, encode_results(results))

    async def close(self) -> None:
        async with self._lock:
            self._db.close()


class NoCache:
    """Every lookup misses (cache off)."""

    async def get(self, key: str) -> list[WebResult] | None:
        return None

    async def put(self, key: str, results: list[WebResult]) -> None:
        return None

    async def close(self) -> None:
        return None
