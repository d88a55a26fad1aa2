"""searchr1 rollout service (docs/architecture.md, "Services"; docs/rollout.md)."""
