"""Rollout tools around the worker: `once` (one trajectory, shown; `searchr1 rollout once`) and `steering`
(a vLLM logits processor that forces the turn structure on random models, for benchmarks and demos)."""
