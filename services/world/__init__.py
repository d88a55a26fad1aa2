"""The tiny world: a deterministic synthetic knowledge base, questions, tokenizer, model and warm start
for end-to-end CPU runs (docs/world.md). Imports only `searchr1.core`."""
