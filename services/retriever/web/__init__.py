"""Web search APIs (Serper, SerpAPI, Brave Search, SearXNG) as the retriever's search backend, with an
answer cache, a token bucket, a concurrency cap, bounded retries and a run budget (docs/retriever.md,
"Training with a web search backend")."""
