"""searchr1 reward service (docs/architecture.md, "Services"; docs/reward.md)."""
