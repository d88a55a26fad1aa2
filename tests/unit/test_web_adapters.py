"""The web search adapters on each API's documented JSON, and on what a provider sends when things go
wrong (HTML, a JSON error, missing fields, markup, huge snippets); the requests they build; the cache's
query normalisation; the token bucket and budget arithmetic, with hand-checked numbers."""

from __future__ import annotations

import json

import pytest

from searchr1.retriever.web.adapters import MalformedResponse, build_request, clean_text, parse_response
from searchr1.retriever.web.cache import cache_key, decode_results, encode_results, normalize_query
from searchr1.retriever.web.limits import (
    Budget,
    BudgetExhausted,
    LocalCounter,
    TokenBucket,
    refill,
    spend,
    wait_for_token,
    within_budget,
)
from searchr1.retriever.web.settings import WebSettings

CUTS = {k: getattr(WebSettings(), k) for k in ("max_title_chars", "max_snippet_chars")}
"""The title and snippet cuts of `[retriever.web]` by default."""
SERPER = {"searchParameters": {"q": "capital of france", "type": "search"},
          "knowledgeGraph": {"title": "Paris"},
          "organic": [{"title": "Paris - Wikipedia", "link": "https://en.wikipedia.org/wiki/Paris",
                       "snippet": "Paris is the capital and most populous city of France.", "position": 1},
                      {"title": "France", "link": "https://en.wikipedia.org/wiki/France",
                       "snippet": "France, officially the French Republic ...", "position": 2}]}
SERPAPI = {"search_metadata": {"status": "Success"},
           "organic_results": [{"position": 1, "title": "Paris - Wikipedia", "link": "https://en.wikipedia.org/wiki/Paris",
                                "snippet": "Paris is the capital and most populous city of France."}]}
BRAVE = {"type": "search", "query": {"original": "capital of france"},
         "web": {"type": "search", "results": [
             {"title": "Paris - Wikipedia", "url": "https://en.wikipedia.org/wiki/Paris",
              "description": "<strong>Paris</strong> is the capital &amp; largest city of France."}]}}
SEARXNG = {"query": "capital of france", "number_of_results": 1,
           "results": [{"url": "https://en.wikipedia.org/wiki/Paris", "title": "Paris - Wikipedia",
                        "content": "Paris is the capital of France.", "engine": "wikipedia", "score": 3.5}]}


def _body(data) -> bytes:
    return json.dumps(data).encode()


@pytest.mark.parametrize("provider, data, snippet", [
    ("serper", SERPER, "Paris is the capital and most populous city of France."),
    ("serpapi", SERPAPI, "Paris is the capital and most populous city of France."),
    ("brave", BRAVE, "Paris is the capital & largest city of France."),
    ("searxng", SEARXNG, "Paris is the capital of France."),
])
def test_each_provider_maps_to_wiki_shaped_passages(provider, data, snippet):
    parsed = parse_response(provider, _body(data), 3, **CUTS)
    first = parsed.results[0]
    assert first.url == "https://en.wikipedia.org/wiki/Paris" and first.title == "Paris - Wikipedia"
    assert first.contents == f'"Paris - Wikipedia"\n{snippet}'  # title on the first line, as wiki-18 rows
    assert first.score == 1.0 and parsed.skipped == 0 and parsed.truncated == 0


def test_ranks_score_one_over_rank_and_top_k_cuts():
    parsed = parse_response("serper", _body(SERPER), 3, **CUTS)
    assert [r.score for r in parsed.results] == [1.0, 0.5]
    assert len(parse_response("serper", _body(SERPER), 1, **CUTS).results) == 1


@pytest.mark.parametrize("body", [
    b"<html><body>Please verify you are a human</body></html>",
    b"",
    b"\xff\xfe\x00garbage",
    _body({"error": "Invalid API key"}),
    _body({"organic": "not a list"}),
    _body(["a", "list"]),
])
def test_not_the_documented_json_is_malformed(body):
    with pytest.raises(MalformedResponse):
        parse_response("serper", body, 3, **CUTS)


def test_error_json_names_the_providers_error():
    with pytest.raises(MalformedResponse, match="Invalid API key"):
        parse_response("serpapi", _body({"error": "Invalid API key."}), 3, **CUTS)


def test_results_without_url_or_text_are_skipped_and_counted():
    data = {"organic": [{"title": "no link", "snippet": "x"}, "not a dict", {"link": "https://a", "title": None},
                        {"link": "https://b", "title": "B", "snippet": 7}, {"link": "https://c", "snippet": "only text"}]}
    parsed = parse_response("serper", _body(data), 10, **CUTS)
    assert [r.url for r in parsed.results] == ["https://b", "https://c"]
    assert parsed.results[0].contents == '"B"\n' and parsed.results[1].contents == '""\nonly text'
    assert [r.score for r in parsed.results] == [1.0, 0.5]  # ranks count kept results
    assert parsed.skipped == 3


def test_huge_snippets_are_cut_and_counted():
    data = {"results": [{"url": "https://a", "title": "T" * 1000, "content": "word " * 200_000}]}
    parsed = parse_response("searxng", _body(data), 3, max_title_chars=10, max_snippet_chars=100)
    r = parsed.results[0]
    assert r.title == "T" * 10 and len(r.contents) <= 2 + 10 + 1 + 100 and parsed.truncated == 2


def test_brave_without_web_results_is_an_empty_answer():
    assert parse_response("brave", _body({"type": "search", "query": {"original": "zzz"}}), 3, **CUTS).results == []


def test_clean_text():
    assert clean_text("  <b>A</b>&nbsp;&amp; \n b ", 100) == ("A & b", False)
    assert clean_text(None, 10) == ("", False)
    assert clean_text("abcdef", 3) == ("abc", True)


def test_requests_carry_the_key_where_each_api_documents_it():
    serper = build_request("serper", "https://google.serper.dev/", "q", 10, "K")
    assert (serper.method, serper.url, serper.json, serper.headers["X-API-KEY"]) == (
        "POST", "https://google.serper.dev/search", {"q": "q", "num": 10}, "K")
    serpapi = build_request("serpapi", "https://serpapi.com", "q", 10, "K")
    assert serpapi.url == "https://serpapi.com/search.json" and serpapi.params["api_key"] == "K"
    brave = build_request("brave", "https://api.search.brave.com", "q", 50, "K")
    assert brave.headers["X-Subscription-Token"] == "K" and brave.params["count"] == "20"  # Brave's maximum
    searx = build_request("searxng", "http://searx:8080", "q", 10, None)
    assert searx.params == {"q": "q", "format": "json"} and "Authorization" not in searx.headers
    assert all(r.secret == "K" for r in (serper, serpapi, brave))


def test_cache_keys_normalise_case_space_and_unicode_but_not_punctuation():
    assert normalize_query("  Capital\tof  FRANCE ") == "capital of france"
    assert normalize_query("ｃａｆé") == "café"  # NFKC folds full-width letters
    assert cache_key("serper", 10, "Capital of France") == cache_key("serper", 10, " capital  of france")
    assert cache_key("serper", 10, "c++") != cache_key("serper", 10, "c")
    assert cache_key("serper", 10, "q") != cache_key("brave", 10, "q") != cache_key("brave", 20, "q")
    assert len(cache_key("serper", 10, "x" * 10_000)) == len(cache_key("serper", 10, "y"))


def test_cache_values_round_trip_and_garbage_is_a_miss():
    results = parse_response("serper", _body(SERPER), 3, **CUTS).results
    assert decode_results(encode_results(results)) == results
    assert decode_results(b"not json") is None and decode_results(b'[["only two", 1]]') is None


def test_token_bucket_arithmetic():
    assert refill(0.0, 0.5, rate=4.0, burst=5.0) == 2.0
    assert refill(4.5, 10.0, rate=4.0, burst=5.0) == 5.0  # capped at the burst
    assert refill(1.0, -3.0, rate=4.0, burst=5.0) == 1.0  # a clock going back adds nothing
    assert wait_for_token(1.0, 2.0) == 0.0
    assert wait_for_token(0.25, 2.0) == 0.375  # (1 - 0.25) / 2


async def test_token_bucket_lets_the_burst_through_then_paces_at_the_rate():
    now = [0.0]
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    bucket = TokenBucket(rate=2.0, burst=3, clock=lambda: now[0], sleep=sleep)
    waits = [await bucket.acquire() for _ in range(5)]
    assert waits == [0.0, 0.0, 0.0, 0.5, 0.5] and now[0] == 1.0  # 3 at once, then one per 1/2 s
    now[0] += 10.0  # a quiet spell refills to the burst, not beyond
    assert [await bucket.acquire() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]


def test_budget_arithmetic():
    assert spend(2500, price_per_1000=0.3) == pytest.approx(0.75)
    assert within_budget(100, 100, 0.0, None) and not within_budget(101, 100, 0.0, None)
    assert within_budget(1000, None, 5.0, 5.0) and not within_budget(1001, None, 5.0, 5.0)
    assert within_budget(10**9, None, 5.0, None)


async def test_budget_reserves_refuses_and_releases():
    budget = Budget(LocalCounter(), max_queries=None, price_per_1000=2.0, max_spend=0.004)  # 2 queries' worth
    await budget.reserve()
    await budget.reserve()
    assert budget.used == 2 and budget.spent == pytest.approx(0.004) and budget.used_ratio == pytest.approx(1.0)
    with pytest.raises(BudgetExhausted, match="2 billed queries of 0.004 spent at 2 per 1000"):
        await budget.reserve()
    assert budget.used == 2  # the refused reservation was given back
    await budget.release()
    assert budget.used == 1 and budget.used_ratio == pytest.approx(0.5)
    await budget.reserve()


async def test_sqlite_cache_expires_entries_and_survives_reopening(tmp_path):
    from searchr1.retriever.web.cache import SqliteCache

    now = [1000.0]
    results = parse_response("serper", _body(SERPER), 3, **CUTS).results
    cache = SqliteCache(tmp_path / "c.sqlite", ttl_s=60, clock=lambda: now[0])
    await cache.put("k", results)
    now[0] += 59
    assert await cache.get("k") == results and await cache.get("other") is None
    await cache.close()
    reopened = SqliteCache(tmp_path / "c.sqlite", ttl_s=60, clock=lambda: now[0])
    assert await reopened.get("k") == results
    now[0] += 2  # past the TTL
    assert await reopened.get("k") is None
    await reopened.close()


def test_page_text_extraction_chunks_and_overlap_ranking():
    from searchr1.retriever.web.pages import chunk_words, extract_text, is_public_address, overlap_scores

    html = ("<html><head><title>T</title><style>p {}</style><script>x = 1</script></head><body>"
            "<nav>menu</nav><h1>Paris</h1><p>Paris is the <b>capital</b> &amp; largest city.</p>"
            "<ul><li>one</li><li>two</li></ul><footer>legal</footer></body></html>")
    assert extract_text(html) == "Paris\nParis is the capital & largest city.\none\ntwo"  # <head> skipped
    words = " ".join(f"w{i}" for i in range(10))
    assert chunk_words(words, 4, 1) == ["w0 w1 w2 w3", "w3 w4 w5 w6", "w6 w7 w8 w9"]
    assert chunk_words(words, 4) == ["w0 w1 w2 w3", "w4 w5 w6 w7", "w8 w9"]
    assert chunk_words("", 4) == []
    assert overlap_scores("Capital of France", ["the capital of spain", "france", "x"]) == [2 / 3, 1 / 3, 0.0]
    assert is_public_address("example.org", ["93.184.216.34"])
    assert not is_public_address("x", ["127.0.0.1"]) and not is_public_address("x", ["10.1.2.3", "93.184.216.34"])
    assert not is_public_address("x", ["169.254.169.254"]) and not is_public_address("x", [])


def test_the_api_key_comes_from_settings_env_or_file_and_is_never_printed(tmp_path, monkeypatch):
    from searchr1.retriever.settings import RetrieverSettings
    from searchr1.retriever.web.settings import WebSettings

    monkeypatch.setenv("MY_SEARCH_KEY", "from-env")
    secret = tmp_path / "key"
    secret.write_text("from-file\n")
    assert WebSettings(api_key="direct", api_key_env="MY_SEARCH_KEY").resolved_api_key() == "direct"
    assert WebSettings(api_key_env="MY_SEARCH_KEY", api_key_file=secret).resolved_api_key() == "from-env"
    assert WebSettings(api_key_file=secret).resolved_api_key() == "from-file"
    assert WebSettings().resolved_api_key() is None
    monkeypatch.setenv("RETRIEVER_BACKEND", "web")
    monkeypatch.setenv("RETRIEVER_WEB__PROVIDER", "brave")
    monkeypatch.setenv("RETRIEVER_WEB__API_KEY", "sk-env-secret")
    settings = RetrieverSettings()
    assert settings.backend == "web" and settings.web.provider == "brave"
    assert settings.web.resolved_api_key() == "sk-env-secret"
    assert "sk-env-secret" not in repr(settings) and "sk-env-secret" not in settings.model_dump_json()
    assert settings.web.resolved_base_url() == "https://api.search.brave.com"


@pytest.mark.parametrize("address", [
    "64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b:1::a00:1", "2002:7f00:1::1", "2002:a00:1::", "2002:a9fe:a9fe::",
    "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::127.0.0.1", "::10.0.0.1", "2001:0:4136:e378:8000:63bf:3fff:fdd2",
    "fe80::1%eth0", "::1",
])
def test_private_addresses_inside_ipv6_forms_are_not_public(address):
    """NAT64, 6to4, IPv4-mapped, IPv4-compatible and Teredo forms lead to the IPv4 address they embed."""
    from searchr1.retriever.web.pages import is_public_address

    assert not is_public_address("x", [address])


def test_public_addresses_inside_ipv6_forms_stay_public():
    from searchr1.retriever.web.pages import is_public_address

    assert is_public_address("x", ["64:ff9b::5db8:d822", "2002:5db8:d822::1", "2606:4700::1111", "8.8.8.8"])
