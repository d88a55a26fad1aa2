"""searchr1 learner service (docs/architecture.md, "Services"; docs/learner.md)."""
