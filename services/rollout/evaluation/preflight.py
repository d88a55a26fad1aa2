"""What `searchr1 eval` (and the launcher's validation runs) check before an engine starts: that the
retriever answers, accepts the token and searches, and that the reward service answers, accepts the token
and scores. An evaluation whose every search is refused would otherwise print a table of numbers that mean
nothing (the model answering without its search engine) and exit 0.

Each check is one real call the evaluation itself will make — `Info` and one `Search` on the retriever,
`/healthz` and one `exact_match` score on the reward service — so a token the server refuses, a port that
nothing listens on or the wrong service on it fails here, with one line that says which setting to fix.

What this module does not do: retry past the clients' own policy, or judge the results.
"""

from __future__ import annotations

from typing import Any

import grpc

from searchr1.core.clients.retriever import RetrieverError
from searchr1.core.clients.reward import RewardClient, RewardError

RETRIEVER_TOKEN_HINT = ("set ROLLOUT_RETRIEVER__TOKEN (the token the retriever was started with, RETRIEVER_TOKEN), "
                        "or pass --run-dir of the `searchr1 up` run")
REWARD_TOKEN_HINT = ("set ROLLOUT_REWARD__TOKEN (the token the reward service was started with, REWARD_TOKEN), "
                     "or pass --run-dir of the `searchr1 up` run")


class PreflightError(RuntimeError):
    """A service the evaluation needs cannot serve it; the message names the service and what to do."""


async def check_retriever(client: Any, top_k: int) -> dict[str, Any]:
    """The retriever's `Info` (what it serves: the fingerprint's index, corpus and encoder), after one real
    search of `top_k` passages; `PreflightError` when either is refused or unanswered. `client`: the gRPC
    `RetrieverClient` or the `/retrieve` `HttpRetrieverClient`."""
    where = ", ".join(client.addresses)
    info: dict[str, Any] = {}
    try:
        info = await client.info()
    except RetrieverError as exc:
        if exc.code != grpc.StatusCode.UNIMPLEMENTED:  # an older retriever: the search below still checks it
            raise PreflightError(_retriever_message(where, exc)) from None
    try:
        hits = await client.search(["preflight check"], top_k)
    except RetrieverError as exc:
        raise PreflightError(_retriever_message(where, exc)) from None
    if len(hits) != 1:
        raise PreflightError(f"retriever at {where} answered {len(hits)} result lists for one query")
    return info


def _retriever_message(where: str, exc: RetrieverError) -> str:
    if exc.code == grpc.StatusCode.UNAUTHENTICATED or exc.code == grpc.StatusCode.PERMISSION_DENIED:
        return f"retriever at {where} refused the token ({exc.code.name}): {RETRIEVER_TOKEN_HINT}"
    if exc.unavailable:
        return f"retriever at {where} does not answer ({exc}); is it running at that address (--retriever)?"
    return f"retriever at {where} refused a search: {exc}"


async def check_reward(client: RewardClient) -> None:
    """`/healthz`, then one `exact_match` score; `PreflightError` when either fails."""
    if not await client.health():
        raise PreflightError(f"reward service at {client.url} does not answer /healthz; is it running at that "
                             "address (--reward)?")
    try:
        result = await client.score("exact_match", [{"prompt": "", "response": "<answer> Paris </answer>",
                                                     "golden_answers": ["Paris"]}])
    except RewardError as exc:
        if exc.status_code in (401, 403):
            raise PreflightError(f"reward service at {client.url} refused the token ({exc.status_code}): "
                                 f"{REWARD_TOKEN_HINT}") from None
        raise PreflightError(f"reward service at {client.url} cannot score: {exc}") from None
    if [float(s) for s in result.scores] != [1.0]:
        raise PreflightError(f"reward service at {client.url} scored a correct answer {result.scores}: is it a "
                             "searchr1 reward service?")
