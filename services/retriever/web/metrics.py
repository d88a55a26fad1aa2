"""Prometheus metrics of a web search backend, on the retriever's registry. The `backend` label is the
provider name (serper, serpapi, brave, searxng); `outcome` and `reason` are small fixed sets.

Cache hit rate = `cache_hits_total / queries_total`; spend = `spend` (the configured price per 1,000
billed queries × billed queries); `budget_used_ratio` is what the budget alert watches.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)

ERROR_REASONS = ("rate_limited", "server_error", "refused", "timeout", "transport", "malformed",
                 "missing_fields", "truncated", "cache", "budget", "budget_store", "gave_up", "page_failed")
"""`reason` values of `errors_total`."""


@dataclass
class WebMetrics:
    queries: Counter
    """searchr1_retriever_backend_queries_total{backend}: queries the backend answered (cache or API)."""
    requests: Counter
    """searchr1_retriever_backend_requests_total{backend, outcome}: HTTP requests sent to the provider
    (outcome ok | 429 | 5xx | 4xx | timeout | transport)."""
    errors: Counter
    """searchr1_retriever_backend_errors_total{backend, reason}: problems met (see ERROR_REASONS)."""
    cache_hits: Counter
    """searchr1_retriever_backend_cache_hits_total{backend}: queries answered without a billed request
    (a cache entry, or a concurrent identical query's request)."""
    spend: Gauge
    """searchr1_retriever_backend_spend{backend}: money spent so far in the run (billed queries ×
    price per 1,000 / 1,000)."""
    billed: Gauge
    """searchr1_retriever_backend_billed_queries{backend}: billed queries so far in the run."""
    budget_used: Gauge
    """searchr1_retriever_backend_budget_used_ratio{backend}: share of the budget used (0 with no bound)."""
    latency: Histogram
    """searchr1_retriever_backend_request_seconds{backend}: one provider request, including retries."""

    @classmethod
    def create(cls, registry: CollectorRegistry) -> WebMetrics:
        r = registry
        return cls(
            queries=Counter("searchr1_retriever_backend_queries_total", "Queries answered by the search backend.",
                            ["backend"], registry=r),
            requests=Counter("searchr1_retriever_backend_requests_total", "Requests sent to the search API.",
                             ["backend", "outcome"], registry=r),
            errors=Counter("searchr1_retriever_backend_errors_total", "Search backend problems, by reason.",
                           ["backend", "reason"], registry=r),
            cache_hits=Counter("searchr1_retriever_backend_cache_hits_total",
                               "Queries answered without a billed request.", ["backend"], registry=r),
            spend=Gauge("searchr1_retriever_backend_spend", "Money spent on the search API in this run.",
                        ["backend"], registry=r),
            billed=Gauge("searchr1_retriever_backend_billed_queries", "Billed search API queries in this run.",
                         ["backend"], registry=r),
            budget_used=Gauge("searchr1_retriever_backend_budget_used_ratio", "Share of the search budget used.",
                              ["backend"], registry=r),
            latency=Histogram("searchr1_retriever_backend_request_seconds", "Search API request time, retries included.",
                              ["backend"], buckets=LATENCY_BUCKETS, registry=r),
        )
