"""searchr1 retriever service (docs/architecture.md, "Services"; docs/retriever.md)."""
