"""Page fetching for web search against real HTTP servers on loopback: a host is resolved once and the
fetch connects to that address (a second lookup could rebind it), with the host's name in `Host`; a
page whose body drips slowly is cut at the per-fetch deadline and counted, and the snippets are served."""

from __future__ import annotations

import asyncio

import httpx

from searchr1.retriever.web.adapters import WebResult
from searchr1.retriever.web.pages import PageReader
from searchr1.retriever.web.settings import PageSettings

PAGE = b"<html><body><p>Paris is the capital of France.</p></body></html>"


class PageServer:
    """Serves PAGE at once, or (drip) one byte of it every `drip_s` seconds; records each Host header."""

    def __init__(self, drip_s: float | None = None) -> None:
        self.drip_s, self.hosts = drip_s, []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.hosts += [line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                       if line.lower().startswith(b"host:")]
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n" % len(PAGE))
        try:
            if self.drip_s is None:
                writer.write(PAGE)
            else:
                for i in range(len(PAGE)):
                    writer.write(PAGE[i:i + 1])
                    await writer.drain()
                    await asyncio.sleep(self.drip_s)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


def _reader(resolved: list[str], failures: list[str], **pages) -> PageReader:
    async def resolver(host: str, port: int) -> list[str]:
        resolved.append(host)
        return ["127.0.0.1"] if host == "pages.example" else []

    settings = PageSettings(enabled=True, top_pages=1, chunk_words=10, chunk_overlap=0, allow_private_hosts=True,
                            **pages)
    return PageReader(httpx.AsyncClient(), settings, on_failure=failures.append, resolver=resolver)


async def test_the_fetch_connects_to_the_address_resolved_once():
    server = PageServer()
    port = await server.start()
    resolved: list[str] = []
    failures: list[str] = []
    reader = _reader(resolved, failures)
    try:
        snippet = WebResult(f"http://pages.example:{port}/a?q=1", "Paris", "snippet", 1.0)
        hits = await reader.read("capital of france", [snippet], 1)
        assert failures == [] and "capital of France" in hits[0].contents  # the page, not the snippet
        assert resolved == ["pages.example"]  # one lookup; the name is not resolved again to connect
        assert server.hosts == [f"pages.example:{port}"]
    finally:
        await reader.client.aclose()
        await server.stop()


async def test_a_slow_drip_page_is_cut_at_the_deadline():
    server = PageServer(drip_s=0.1)  # the page takes ~7 s to arrive; no single read waits 0.5 s
    port = await server.start()
    failures: list[str] = []
    reader = _reader([], failures, timeout_s=1.0)
    try:
        snippet = WebResult(f"http://pages.example:{port}/slow", "Paris", "snippet", 1.0)
        hits = await reader.read("capital of france", [snippet], 1)
        assert failures == ["deadline"] and hits == [snippet]
    finally:
        await reader.client.aclose()
        await server.stop()
