"""A local stand-in for the four web search APIs, so no test reaches the internet: one FastAPI app on
loopback that answers each provider's documented request with its documented JSON shape, ranking a small
corpus by word overlap with the query, and that can be scripted to misbehave for the next requests
(429, 500, a timeout, HTML instead of JSON, a JSON error, results without fields, huge snippets).

    api = FakeSearchAPI(CORPUS, key="k")      # every provider checks its own key header/parameter
    await api.start(); api.url                 # http://127.0.0.1:PORT
    api.script("429", "429")                   # the next two requests answer 429, then normal again
    api.calls                                  # requests received, per provider
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter, deque
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from searchr1.core.servers import HttpServer

MODES = ("ok", "429", "500", "401", "timeout", "html", "error_json", "missing_fields", "huge", "empty")


class FakeSearchAPI:
    def __init__(self, corpus: Sequence[tuple[str, str]], *, key: str | None = "test-key", timeout_s: float = 5.0,
                 serve_pages: bool = False) -> None:
        self.corpus = list(corpus)
        self.serve_pages = serve_pages
        """Result URLs point at this server's /pages/{title} (an HTML page around the passage) instead of
        example.org."""
        self.key = key
        self.timeout_s = timeout_s
        self.calls: Counter[str] = Counter()
        self.queries: list[str] = []
        self._script: deque[str] = deque()
        self.server = HttpServer(self.app())

    @property
    def url(self) -> str:
        return self.server.url

    def script(self, *modes: str) -> None:
        """Answer the next requests in these modes (then normally again)."""
        for m in modes:
            if m not in MODES:
                raise ValueError(m)
        self._script.extend(modes)

    async def start(self) -> FakeSearchAPI:
        await self.server.start()
        return self

    async def stop(self) -> None:
        await self.server.stop()

    def rank(self, query: str, num: int) -> list[tuple[int, str, str]]:
        words = set(re.findall(r"\w+", query.lower()))
        scored = [(len(words & set(re.findall(r"\w+", f"{t} {x}".lower()))), i) for i, (t, x) in enumerate(self.corpus)]
        order = [i for s, i in sorted(scored, key=lambda p: (-p[0], p[1])) if s > 0][:num]
        return [(i, *self.corpus[i]) for i in order]

    def results(self, provider: str, query: str, num: int, mode: str) -> object:
        rows = self.rank(query, num)
        if mode == "empty":
            rows = []
        url = (self.url + "/pages/{}" if self.serve_pages else "https://example.org/wiki/{}").format

        def item(pos: int, i: int, title: str, text: str) -> dict:
            if mode == "huge":
                text = text + " lorem" * 20_000
            title_key, url_key, text_key = {"serper": ("title", "link", "snippet"),
                                            "serpapi": ("title", "link", "snippet"),
                                            "brave": ("title", "url", "description"),
                                            "searxng": ("title", "url", "content")}[provider]
            if provider == "brave":
                text = text.replace(title, f"<strong>{title}</strong>", 1)
            out = {title_key: title, url_key: url(title.replace(" ", "_")), text_key: text, "position": pos}
            if mode == "missing_fields" and pos % 2 == 1:
                del out[url_key]
            return out

        items = [item(pos, i, t, x) for pos, (i, t, x) in enumerate(rows, start=1)]
        if mode == "missing_fields":
            items.append({"position": 99})
        if provider == "serper":
            return {"searchParameters": {"q": query, "num": num}, "organic": items}
        if provider == "serpapi":
            return {"search_metadata": {"status": "Success"}, "organic_results": items}
        if provider == "brave":
            return {"type": "search", "query": {"original": query}, "web": {"type": "search", "results": items}}
        return {"query": query, "number_of_results": len(items),
                "results": [{**r, "engine": "wikipedia", "score": 1.0} for r in items]}

    async def answer(self, provider: str, query: str, num: int, key: str | None) -> Response:
        self.calls[provider] += 1
        self.queries.append(query)
        mode = self._script.popleft() if self._script else "ok"
        if self.key is not None and key != self.key:
            return JSONResponse({"error": "Invalid API key."}, status_code=401)
        if mode == "429":
            return JSONResponse({"error": "rate limited"}, status_code=429)
        if mode == "500":
            return JSONResponse({"error": "internal"}, status_code=500)
        if mode == "401":
            return JSONResponse({"error": "Invalid API key."}, status_code=401)
        if mode == "timeout":
            await asyncio.sleep(self.timeout_s)
        if mode == "html":
            return HTMLResponse("<html><body><h1>Please verify you are a human</h1></body></html>")
        if mode == "error_json":
            return JSONResponse({"error": "Google hasn't returned any results for this query."})
        return JSONResponse(self.results(provider, query, num, mode))

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/search")
        async def serper(request: Request) -> Response:
            body = await request.json()
            return await self.answer("serper", body["q"], int(body.get("num", 10)), request.headers.get("x-api-key"))

        @app.get("/search.json")
        async def serpapi(q: str, api_key: str = "", num: int = 10, engine: str = "google") -> Response:
            return await self.answer("serpapi", q, num, api_key)

        @app.get("/res/v1/web/search")
        async def brave(request: Request, q: str, count: int = 20) -> Response:
            return await self.answer("brave", q, count, request.headers.get("x-subscription-token"))

        @app.get("/pages/{slug}")
        async def page(slug: str) -> Response:
            self.calls["page"] += 1
            titles = {t.replace(" ", "_"): (t, x) for t, x in self.corpus}
            if slug not in titles:
                return HTMLResponse("<html><body>not found</body></html>", status_code=404)
            title, text = titles[slug]
            filler = " ".join(f"Unrelated sentence {i} about the history of {title} and its people." for i in range(40))
            return HTMLResponse(
                f"<html><head><title>{title}</title><script>var tracking = 'SCRIPT-TEXT';</script></head>"
                f"<body><nav>Main menu NAV-TEXT</nav><h1>{title}</h1><p>{filler}</p>"
                f"<p>{text} PAGE-ONLY fact: the page says more than the snippet.</p>"
                f"<footer>FOOTER-TEXT</footer></body></html>")

        @app.get("/search")
        async def searxng(request: Request, q: str, format: str = "html") -> Response:
            if format != "json":
                return HTMLResponse("<html>searx</html>")
            auth = request.headers.get("authorization", "")
            return await self.answer("searxng", q, 10, auth.removeprefix("Bearer ") or None)

        return app
