"""The local launcher (`searchr1 up`, `searchr1 demo`; docs/launcher.md): runs the whole system as
supervised processes on loopback. Imports only `searchr1.core`; it starts the other services as
subprocesses, never imports them."""
