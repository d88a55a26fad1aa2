"""Where the agent's searches go, as one async function `search(query) -> hits` (the agent loop's
`SearchFn`): your own function (`as_search_fn` takes strings, dicts or objects with `contents`), a running
retriever (gRPC `host:port`, or the http(s) URL of any Search-R1 `/retrieve` server: `retriever_search`), or
an index directory served in this process on a loopback port (`serve_index`, the same server
`searchr1 serve retriever` runs).

A hit is what the agent formats into `<information>`: `contents` whose first line is the title, as in
Search-R1's wiki-18 corpus (`"Title"\\ntext`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchr1.core.clients.http_retriever import retriever_client
from searchr1.core.settings import RetrySettings


@dataclass(frozen=True, slots=True)
class Passage:
    """A retrieved passage as the agent reads it."""

    contents: str
    """`"Title"\\ntext`: the first line is the title (wiki-18's layout)."""
    doc_id: str = ""
    score: float = 0.0

    @property
    def title(self) -> str:
        return self.contents.split("\n", 1)[0].strip().strip('"')


def to_passage(hit: Any) -> Passage:
    """A hit of any common shape: a string (the passage), a mapping with `contents` (or `title` and
    `text`), or an object with a `contents` attribute."""
    if isinstance(hit, Passage):
        return hit
    if isinstance(hit, str):
        return Passage(hit)
    if isinstance(hit, Mapping):
        doc = hit.get("document", hit)
        if "contents" in doc:
            return Passage(str(doc["contents"]), str(doc.get("id", "")), float(hit.get("score", 0.0) or 0.0))
        if "text" in doc:
            title = doc.get("title")
            return Passage(f'"{title}"\n{doc["text"]}' if title else str(doc["text"]), str(doc.get("id", "")))
        raise TypeError(f"a search hit mapping needs `contents` (or `title` and `text`), got keys {sorted(doc)}")
    contents = getattr(hit, "contents", None)
    if isinstance(contents, str):
        return Passage(contents, str(getattr(hit, "doc_id", "")), float(getattr(hit, "score", 0.0) or 0.0))
    raise TypeError(f"cannot read a search hit of type {type(hit).__name__}: give strings, dicts with contents, "
                    "or objects with a contents attribute")


SearchFn = Callable[[str], Awaitable[Sequence[Passage]]]


def as_search_fn(search: Callable[[str], Any]) -> SearchFn:
    """Your search function as the agent's: async or not, returning hits of any shape `to_passage` reads."""

    async def wrapped(query: str) -> list[Passage]:
        hits = search(query)
        if inspect.isawaitable(hits):
            hits = await hits
        return [to_passage(h) for h in hits]

    return wrapped


def passages_per_search() -> int:
    """The rollout worker's passages per search (`[rollout.retriever] top_k`'s default: Search-R1's 3)."""
    from searchr1.rollout.settings import RetrieverClientSettings

    return RetrieverClientSettings().top_k


class RetrieverSearch:
    """Searches of one query each against a running retriever: gRPC `host:port`, or an http(s) URL of a
    Search-R1 `/retrieve` server. `await it(query)`; `await it.close()` when done."""

    def __init__(self, address: str | Sequence[str], *, top_k: int | None = None, token: str | None = None,
                 retry: RetrySettings | None = None) -> None:
        """`top_k`: passages per search (None: `[rollout.retriever] top_k`'s default)."""
        addresses = [address] if isinstance(address, str) else list(address)
        self.client = retriever_client(addresses, token=token, retry=retry)
        self.top_k = top_k if top_k is not None else passages_per_search()
        self.http_url: str | None = None
        """With `serve_index(..., http=True)`: the Search-R1 `/retrieve` URL of the served index."""

    async def __call__(self, query: str) -> list[Passage]:
        (hits,) = await self.client.search([query], self.top_k)
        return [Passage(h.contents, h.doc_id, h.score) for h in hits]

    async def info(self) -> dict:
        return await self.client.info()

    async def close(self) -> None:
        await self.client.close()


def retriever_search(address: str | Sequence[str], *, top_k: int | None = None,
                     token: str | None = None) -> RetrieverSearch:
    """A search function over a running retriever (`RetrieverSearch`)."""
    return RetrieverSearch(address, top_k=top_k, token=token)


@contextlib.asynccontextmanager
async def serve_index(index_dir: str | Path, *, top_k: int | None = None,
                      http: bool = False) -> AsyncIterator[RetrieverSearch]:
    """Serve the index at `index_dir` in this process (gRPC on a free loopback port, no token: only this
    process knows the port; with `http`, Search-R1's `POST /retrieve` too, at `.http_url`) and yield a search
    function over it; stopped on exit."""
    from searchr1.retriever.server import open_index, start_retriever
    from searchr1.retriever.settings import RetrieverSettings

    settings = RetrieverSettings(index=Path(index_dir), host="127.0.0.1", grpc_port=0, http_port=0 if http else None,
                                 metrics_port=None)
    loaded = await asyncio.to_thread(open_index, settings)
    running = await start_retriever(settings, loaded)
    search = RetrieverSearch(running.grpc_address, top_k=top_k)
    search.http_url = running.http.url if running.http is not None else None
    try:
        yield search
    finally:
        await search.close()
        await running.stop()
