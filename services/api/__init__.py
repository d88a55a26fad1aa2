"""searchr1 as a library (docs/python.md): score answers, ask a trained policy questions with your own
search function, evaluate it on a test set, and search any Search-R1 `/retrieve` server.

    from searchr1.api import ask, evaluate, score, retriever_search

The face lists the API; the modules behind it are `scoring`, `search`, `asking` and `evaluating`. It sits
above the services (it composes the rollout agent loop, the retriever server and the reward scorers) and
below nothing but the CLI; the services never import it.
"""

from searchr1.api.asking import Asker, AskResult, Turn, ask, ask_async, ask_settings, open_asker, turns_of
from searchr1.api.evaluating import evaluate, evaluate_async
from searchr1.api.scoring import LocalScorer, ScoringError, score, score_async
from searchr1.api.search import Passage, RetrieverSearch, as_search_fn, retriever_search, serve_index
from searchr1.core.clients.http_retriever import HttpRetrieverClient

__all__ = [
    "AskResult", "Asker", "HttpRetrieverClient", "LocalScorer", "Passage", "RetrieverSearch", "ScoringError", "Turn",
    "as_search_fn", "ask", "ask_async", "ask_settings", "evaluate", "evaluate_async", "open_asker",
    "retriever_search", "score", "score_async", "serve_index", "turns_of",
]
