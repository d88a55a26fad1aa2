"""Shared foundation of every searchr1 service: settings, wire schemas, the Search-R1 protocol, metrics,
server helpers, auth, retry policy, clients, the progress watchdog, fault points and the generated gRPC
stubs. The two protocols that span processes have packages of their own: the Redis delivery contract
(`searchr1.streams`) and weight sync (`searchr1.weightsync`).

It never imports torch, vLLM, transformers, FAISS or numpy (an import-linter contract enforces it), so
anything here is cheap to import from a CLI or a test.
"""
