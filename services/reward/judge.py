"""LLM judge over an OpenAI-compatible `POST {url}/v1/chat/completions` endpoint (vLLM, SGLang, OpenAI …):
formats the grading prompt, asks, parses a yes/no (or a number in [0, 1]) verdict, with per-attempt
timeouts, retries with backoff and jitter on connection errors, timeouts, 429 and 5xx (the shared policy
of `searchr1.core.retry`; any other 4xx fails at once), a bound on concurrent calls,
and an in-memory LRU cache of verdicts keyed by the SHA-256 of the request (at most `cache_size` entries of
fixed size; same model + prompt + sampling → same verdict; temperature 0 is the default so this is sound).
The prompt template holds only plain named fields (`params.template_parts`), rendered by concatenation;
the policy's answer is fenced as `<candidate>…</candidate>` (`params.delimit_prediction`).

Owns the HTTP exchange only; verdict parsing is `scoring.parse_judge_verdict`. The endpoint URL and key
are server configuration, never request parameters (a request must not make the service call out to an
arbitrary address).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence

import httpx

from searchr1.core.retry import TransientHTTPStatus, is_transient_http_status, retrying
from searchr1.reward import scoring
from searchr1.reward.params import delimit_prediction, render_template
from searchr1.reward.registry import JudgeParams
from searchr1.reward.settings import JudgeSettings


class JudgeUnavailable(RuntimeError):
    """The judge endpoint did not give a usable answer after the retries (→ HTTP 502)."""


class LLMJudge:
    """Grades answers with a chat model. `on_event(outcome)` is called with `call`, `cache_hit`, `retry`,
    `error` or `unparsed` (the service counts them in Prometheus)."""

    def __init__(self, url: str, settings: JudgeSettings, *,
                 on_event: Callable[[str], None] | None = None) -> None:
        """`url`: the OpenAI-compatible endpoint; `settings`: the `[reward.judge]` table (model, key, retry
        policy, cache size, concurrency; its `url` is not read)."""
        self.url = url.rstrip("/")
        self.model = settings.model
        self.retries = settings.retries
        self.backoff_s = settings.backoff_s
        self.max_backoff_s = settings.max_backoff_s
        self.deadline_s = settings.deadline_s
        self.cache_size = settings.cache_size
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self._http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(settings.timeout_s))
        self._cache: OrderedDict[str, float] = OrderedDict()
        self._sem = asyncio.Semaphore(settings.max_concurrency)
        self._on_event = on_event or (lambda _outcome: None)

    async def close(self) -> None:
        await self._http.aclose()

    def _endpoint(self) -> str:
        return self.url if self.url.endswith("/chat/completions") else (
            f"{self.url}/chat/completions" if self.url.endswith("/v1") else f"{self.url}/v1/chat/completions")

    async def judge(self, question: str, prediction: str, golds: Sequence[str], params: JudgeParams) -> float:
        """The verdict in [0, 1] for one answer (an unparseable verdict counts as 0)."""
        content = render_template(params.prompt, {"question": question, "golds": "; ".join(golds),
                                                  "prediction": delimit_prediction(prediction)})
        body = {"model": params.model or self.model, "messages": [{"role": "user", "content": content}],
                "max_tokens": params.max_tokens, "temperature": params.temperature}
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()  # 64 bytes per entry
        if key in self._cache:
            self._cache.move_to_end(key)
            self._on_event("cache_hit")
            return self._cache[key]
        text = await self._complete(body)
        verdict = scoring.parse_judge_verdict(text)
        if verdict is None:
            self._on_event("unparsed")
            verdict = 0.0
        self._cache[key] = verdict
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return verdict

    async def _complete(self, body: dict) -> str:
        attempts = 0
        async with self._sem:
            try:
                async for attempt in retrying(retries=self.retries, backoff_s=self.backoff_s,
                                              max_backoff_s=self.max_backoff_s, deadline_s=self.deadline_s,
                                              before_sleep=lambda _state: self._on_event("retry")):
                    with attempt:
                        attempts += 1
                        self._on_event("call")
                        response = await self._http.post(self._endpoint(), json=body)
                        if is_transient_http_status(response.status_code):
                            raise TransientHTTPStatus(response)
            except (httpx.TransportError, TransientHTTPStatus) as exc:
                self._on_event("error")
                last = str(exc) if isinstance(exc, TransientHTTPStatus) else f"{type(exc).__name__}: {exc}"
                raise JudgeUnavailable(f"judge at {self._endpoint()} failed after {attempts} attempt(s): "
                                       f"{last}") from None
        if response.status_code >= 400:
            self._on_event("error")
            raise JudgeUnavailable(f"judge refused the request ({response.status_code}): {response.text[:500]}")
        try:
            return str(response.json()["choices"][0]["message"]["content"] or "")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            self._on_event("error")
            raise JudgeUnavailable(f"judge answered an unexpected body: {exc!r}") from None
