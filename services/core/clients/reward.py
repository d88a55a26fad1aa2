"""The reward service's wire format (one definition, used by the FastAPI app and by this client) and the
async HTTP client rollout workers use to score trajectories.

Wire format (JSON over HTTP):
- `POST /v1/score` with a `ScoreRequest` → `ScoreResult` (scores and per-item component breakdowns, in
  item order). Bad bodies answer 422 with a message in `detail`.
- `GET /v1/scorers` → `{"scorers": [{"name", "description", "input", "params"}, ...]}`.
- `GET /healthz` → `{"status": "ok"}`.

An item has one of two shapes:
- Search-R1's own: `{"solution_str": <decoded prompt+response>, "ground_truth": {"target": [answers]}}`;
- ours: `{"prompt": ..., "response": ..., "golden_answers": [...], "num_searches": n (optional)}`.
The `searchr1_*` scorers accept both (for the second they score `prompt + response`, as Search-R1 does);
the other scorers need the second shape because they score the response alone.

The client retries only what can succeed on a second try (connection errors, timeouts, 429, 5xx), with
the shared policy of `searchr1.core.retry`; any other 4xx raises `RewardError` at once with the server's
message. Core module: no numpy/torch here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Self

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from searchr1.core.auth import http_headers
from searchr1.core.retry import TransientHTTPStatus, is_transient_http_status, retrying
from searchr1.core.settings import RetrySettings, RewardRetrySettings

MAX_ITEMS_PER_REQUEST = 65_536
"""Hard cap of the wire format; the server's configured bound (`max_batch_items`) is usually lower."""
MAX_TEXT_CHARS = 4_000_000
"""Longest string accepted in any item field (a guard against absurd bodies, far above real rollouts)."""
SCORER_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class GroundTruth(BaseModel):
    """Search-R1's `reward_model.ground_truth`: the list of acceptable answers."""

    model_config = ConfigDict(extra="forbid")
    target: list[str] = Field(max_length=1024)
    """Gold answers; any one of them counts."""


class ScoreItem(BaseModel):
    """One thing to score: either `{solution_str, ground_truth}` (Search-R1's arguments) or
    `{prompt, response, golden_answers[, num_searches]}`. Mixing the two shapes is an error."""

    model_config = ConfigDict(extra="forbid")
    solution_str: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    """Search-R1 shape: the decoded prompt + response, special tokens kept."""
    ground_truth: GroundTruth | None = None
    """Search-R1 shape: `{"target": [answers]}`."""
    prompt: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    """Our shape: the full prompt text as the model saw it (chat template applied)."""
    response: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    """Our shape: everything after the prompt (model turns and environment observations)."""
    golden_answers: list[str] | None = Field(default=None, max_length=1024)
    """Our shape: gold answers; any one of them counts."""
    num_searches: int | None = Field(default=None, ge=0, le=1_000_000)
    """Our shape, optional: searches the trajectory made (else counted from `<search>` tags)."""

    @model_validator(mode="after")
    def _one_shape(self) -> ScoreItem:
        searchr1 = self.solution_str is not None or self.ground_truth is not None
        ours = (self.prompt is not None or self.response is not None or self.golden_answers is not None
                or self.num_searches is not None)
        if searchr1 and ours:
            raise ValueError("an item is either {solution_str, ground_truth} or "
                             "{prompt, response, golden_answers[, num_searches]}, not a mix of both")
        if searchr1:
            if self.solution_str is None or self.ground_truth is None:
                raise ValueError("a Search-R1 item needs both solution_str and ground_truth")
        elif self.prompt is None or self.response is None or self.golden_answers is None:
            raise ValueError("an item needs prompt, response and golden_answers "
                             "(or solution_str and ground_truth)")
        return self

    @property
    def golds(self) -> list[str]:
        """The gold answers, whichever shape the item has."""
        return self.ground_truth.target if self.ground_truth is not None else list(self.golden_answers or [])

    @property
    def full_text(self) -> str:
        """What Search-R1 scores: `solution_str`, or `prompt + response`."""
        return self.solution_str if self.solution_str is not None else (self.prompt or "") + (self.response or "")


class ScoreRequest(BaseModel):
    """Body of `POST /v1/score`."""

    model_config = ConfigDict(extra="forbid")
    scorer: str = Field(pattern=SCORER_NAME_PATTERN)
    """Registered scorer name (see `GET /v1/scorers`)."""
    params: dict[str, Any] = Field(default_factory=dict)
    """The scorer's parameters; unset ones come from the server config, then the scorer's defaults."""
    items: list[ScoreItem] = Field(max_length=MAX_ITEMS_PER_REQUEST)
    """What to score, answered in the same order."""


class ScoreResult(BaseModel):
    """Body of the `POST /v1/score` answer: one score and one component breakdown per item."""

    scores: list[float]
    """The reward of each item, in request order."""
    components: list[dict[str, float]]
    """Per item: named parts of the score (e.g. each composite component's raw value) for logging."""


class RewardError(RuntimeError):
    """Scoring failed: the server refused the request (4xx, with its message) or did not answer after
    the retries (connection errors, timeouts, 429, 5xx)."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:2000]
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):  # FastAPI validation errors
        parts = []
        for err in detail:
            if isinstance(err, dict):
                loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
                parts.append(f"{loc}: {err.get('msg', '')}" if loc else str(err.get("msg", "")))
            else:
                parts.append(str(err))
        return "; ".join(parts)[:2000]
    return str(detail)[:2000]


DEFAULT_RETRY = RewardRetrySettings().retry_policy()
"""The client's retry policy when none is given: the defaults of the `[rollout.reward]` table (a 30 s
attempt: scoring takes longer than a search; backoff capped at 2 s, as for every client)."""


class RewardClient:
    """Async client of the reward service.

    `retry` (`RetrySettings`; default `DEFAULT_RETRY`): `timeout_s` bounds each attempt; `retries` extra
    attempts follow a transient failure with exponential backoff (with jitter) from `backoff_s`, capped at
    `max_backoff_s`; an optional `deadline_s` (per call, or the client's default) bounds all attempts
    together. `on_retry` is called before each
    retry and `on_give_up` when a call fails after its transient attempts, for the caller's counters.
    """

    def __init__(self, url: str, *, token: str | None = None, retry: RetrySettings | None = None,
                 on_retry: Callable[[BaseException], None] | None = None,
                 on_give_up: Callable[[str], None] | None = None) -> None:
        self.url = url.rstrip("/")
        self.retry = (retry or DEFAULT_RETRY).retry_policy()
        self.on_retry = on_retry
        self.on_give_up = on_give_up
        self._http = httpx.AsyncClient(base_url=self.url, headers=http_headers(token),
                                       timeout=httpx.Timeout(self.retry.timeout_s))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def score(self, scorer: str, items: Sequence[ScoreItem | dict], params: dict | None = None, *,
                    deadline_s: float | None = None) -> ScoreResult:
        """Score `items` with the named scorer; answers are in item order."""
        try:
            request = ScoreRequest(
                scorer=scorer, params=dict(params or {}),
                items=[i if isinstance(i, ScoreItem) else ScoreItem.model_validate(i) for i in items])
        except ValidationError as exc:
            raise RewardError(f"invalid score request: {exc}") from exc
        if not request.items:
            return ScoreResult(scores=[], components=[])
        body = request.model_dump(mode="json", exclude_none=True)
        response = await self._request("POST", "/v1/score", json=body, deadline_s=deadline_s)
        result = ScoreResult.model_validate(response.json())
        if len(result.scores) != len(request.items) or len(result.components) != len(request.items):
            raise RewardError(f"reward service answered {len(result.scores)} scores for {len(request.items)} items")
        return result

    async def scorers(self) -> list[dict]:
        """The server's scorers: name, description, input shape and the JSON schema of their params."""
        response = await self._request("GET", "/v1/scorers")
        return list(response.json()["scorers"])

    async def health(self) -> bool:
        """True when `GET /healthz` answers 200 (one attempt, no retries)."""
        try:
            return (await self._http.get("/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    async def _request(self, method: str, path: str, *, json: Any = None,
                       deadline_s: float | None = None) -> httpx.Response:
        r = self.retry
        deadline_s = r.deadline_s if deadline_s is None else deadline_s
        end = None if deadline_s is None else time.monotonic() + deadline_s
        attempts = 0
        try:
            async for attempt in retrying(retries=r.retries, backoff_s=r.backoff_s,
                                          max_backoff_s=r.max_backoff_s, deadline_s=deadline_s,
                                          on_retry=self.on_retry):
                with attempt:
                    timeout = r.timeout_s if end is None else min(r.timeout_s, end - time.monotonic())
                    if timeout <= 0:
                        break
                    attempts += 1
                    response = await self._http.request(method, path, json=json, timeout=timeout)
                    if response.status_code < 400:
                        return response
                    if is_transient_http_status(response.status_code):
                        raise TransientHTTPStatus(response, _detail(response))
                    raise RewardError(f"reward service refused the request ({response.status_code}): "
                                      f"{_detail(response)}", response.status_code)
            last = "no attempt left before the deadline"
        except (httpx.TransportError, TransientHTTPStatus) as exc:  # the last attempt's transient error
            last = str(exc) if isinstance(exc, TransientHTTPStatus) else f"{type(exc).__name__}: {exc}"
        deadline = end is not None and (attempts <= r.retries or time.monotonic() >= end)
        if self.on_give_up is not None:
            self.on_give_up(last)
        raise RewardError(f"reward service at {self.url} failed after {attempts} attempt(s)"
                          f"{' (deadline exceeded)' if deadline else ''}: {last}")
