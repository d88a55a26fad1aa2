"""The multi-turn search agent: one trajectory as a small state machine (docs/architecture.md, "Protocol").

    GENERATE turn ──stop `</answer>`──────────────────────────────► done (answer)
       │  ├─stop `</search>` → SEARCH → observation (mask 0) ──► GENERATE (next turn)
       │  ├─no action → invalid-action text (mask 0) ────────────► GENERATE (next turn)
       │  ├─EOS without an action ─────────────────────────────► done (eos)
       │  └─response budget used up ──────────────────────────► done (length)
       └─ after `max_turns` turns: one FINAL turn; only an answer counts (a search is not executed)
          ─► done (answer | max_turns | eos | length)
    a search that fails ends the trajectory: `retriever_unavailable` when the retriever could not be
    reached within the client's bounded retries, `search_budget` when the run's web search budget is
    spent, `error` when it refused the query otherwise; what was generated so far is kept, so the group
    is still published and the worker carries on.

Each turn's prompt is `prompt_ids + response_ids so far`, passed to the engine as token ids. The
response keeps the exact ids the engine sampled (mask 1, their behaviour log-probs) and the
tokenised environment text (mask 0, log-prob 0). Many trajectories run as independent asyncio tasks
over one engine, so one waiting on search never blocks another's generation.

Limits: `max_tokens_per_turn` per generation; `max_obs_tokens` per observation (truncation keeps the
closing `</information>\\n\\n` and is counted); `max_response_tokens` over the whole response
(sampled + environment; finish reason `length`).

Departures from Search-R1 (`search_r1/llm_agent/generation.py`), on purpose:
- turns stop at `</search>`/`</answer>` instead of being cut after generation (no wasted tokens);
- the ids are the sampled ids, never a re-tokenisation of the cut text;
- a truncated observation keeps its closing tag (Search-R1 cuts it off);
- a turn ending in EOS with no action ends the trajectory (`eos`) instead of appending the
  invalid-action text after EOS.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from searchr1.core.clients.retriever import RetrieverError
from searchr1.core.protocol import INVALID_ACTION_MESSAGE, STOP_STRINGS, Action, observation_for, parse_action
from searchr1.core.schemas import FinishReason, Segment
from searchr1.core.segments import segments_from_versions
from searchr1.rollout.engine import Generator, TextCodec, TurnOutput, TurnRequest
from searchr1.rollout.settings import AgentSettings

OBS_CLOSE = "</information>\n\n"
"""The tail an observation always keeps when truncated."""


class HitLike(Protocol):
    contents: str


SearchFn = Callable[[str], Awaitable[Sequence[HitLike]]]
"""Search one query, returning its hits (each with a `contents` string whose first line is the title)."""


@dataclass(frozen=True, slots=True)
class AgentLimits:
    """Turn and token limits of one trajectory: a frozen view of `AgentSettings`, built by `from_settings`
    (the settings fields declare the defaults)."""

    max_turns: int
    max_tokens_per_turn: int
    max_obs_tokens: int
    max_response_tokens: int
    max_context_tokens: int | None = None
    """The engine's context length (prompt + response), if it is to be respected here."""

    @classmethod
    def from_settings(cls, agent: AgentSettings, *, max_context_tokens: int | None = None,
                      max_tokens_per_turn: int | None = None) -> AgentLimits:
        """The limits of `agent` (`max_tokens_per_turn`: a task's own budget, when it sets one);
        `max_context_tokens` is the engine's context length."""
        per_turn = agent.max_tokens_per_turn if max_tokens_per_turn is None else max_tokens_per_turn
        return cls(max_turns=agent.max_turns, max_tokens_per_turn=per_turn,
                   max_obs_tokens=agent.max_obs_tokens, max_response_tokens=agent.max_response_tokens,
                   max_context_tokens=max_context_tokens)


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling parameters of every turn of a trajectory: a frozen view of `AgentSettings`, built by
    `from_settings` (the settings fields declare the defaults)."""

    temperature: float
    top_p: float
    top_k: int
    seed: int | None = None
    extra_args: dict[str, Any] | None = None

    @classmethod
    def from_settings(cls, agent: AgentSettings, *, seed: int | None = None, temperature: float | None = None,
                      top_p: float | None = None, top_k: int | None = None) -> Sampling:
        """The sampling of `agent`; a value given here (a task's or a command's own) takes precedence
        over the setting."""
        return cls(temperature=agent.temperature if temperature is None else temperature,
                   top_p=agent.top_p if top_p is None else top_p, top_k=agent.top_k if top_k is None else top_k,
                   seed=seed, extra_args=dict(agent.extra_args) or None)


@dataclass
class TrajectoryResult:
    """A finished trajectory before scoring, plus what the metrics need."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behavior_logprobs: list[float] = field(default_factory=list)
    num_turns: int = 0
    num_searches: int = 0
    finish_reason: FinishReason = "answer"
    answer: str | None = None
    generated_tokens: int = 0
    env_tokens: int = 0
    obs_truncations: int = 0
    search_seconds: float = 0.0
    generate_seconds: float = 0.0
    error: str | None = None

    token_versions: list[int | None] = field(default_factory=list)
    """The weight version behind each response token; None on environment tokens and on sampled tokens
    whose version the generator does not track (whole-trajectory rollouts)."""

    def add_sampled(self, ids: Sequence[int], logprobs: Sequence[float],
                    versions: Sequence[int] | None = None) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.behavior_logprobs.extend(logprobs)
        self.token_versions.extend(versions if versions is not None else [None] * len(ids))
        self.generated_tokens += len(ids)

    def add_env(self, ids: Sequence[int]) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.behavior_logprobs.extend([0.0] * len(ids))
        self.token_versions.extend([None] * len(ids))
        self.env_tokens += len(ids)

    def segments(self) -> list[Segment]:
        """`Trajectory.segments` of the response: empty unless every sampled token's version is known."""
        if any(v is None for v, m in zip(self.token_versions, self.loss_mask) if m):
            return []
        return segments_from_versions(self.token_versions)


def truncate_observation(obs_ids: list[int], close_ids: list[int], limit: int) -> tuple[list[int], bool]:
    """Cut an observation to `limit` tokens, keeping `close_ids` (the closing tag) at its end when it
    fits. Returns (ids, truncated?)."""
    if len(obs_ids) <= limit:
        return obs_ids, False
    if limit <= len(close_ids):
        return obs_ids[:limit], True
    return obs_ids[: limit - len(close_ids)] + close_ids, True


def search_failure_reason(exc: BaseException) -> FinishReason:
    """The finish reason of a trajectory whose search raised `exc` (see the module docstring)."""
    if isinstance(exc, RetrieverError):
        if exc.unavailable:
            return "retriever_unavailable"
        if exc.budget_spent:
            return "search_budget"
    return "error"


def token_room(res: TrajectoryResult, limits: AgentLimits) -> int:
    """Tokens the response may still grow by: what is left of `max_response_tokens` and, when it is to be
    respected, of the engine's context."""
    room = limits.max_response_tokens - len(res.response_ids)
    if limits.max_context_tokens is not None:
        room = min(room, limits.max_context_tokens - len(res.prompt_ids) - len(res.response_ids))
    return room


async def sample_turn(generator: Generator, res: TrajectoryResult, sampling: Sampling, max_tokens: int,
                      turn: int, request_id: str) -> TurnOutput:
    """Generate turn `turn` on the whole context so far and append what was sampled (mask 1)."""
    seed = None if sampling.seed is None else sampling.seed + 7919 * turn
    t0 = time.perf_counter()
    out = await generator.generate(
        TurnRequest(
            prompt_ids=res.prompt_ids + res.response_ids,
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=seed,
            stop=STOP_STRINGS,
            extra_args=sampling.extra_args,
        ),
        f"{request_id}-t{turn}",
    )
    res.generate_seconds += time.perf_counter() - t0
    res.add_sampled(out.token_ids, out.logprobs, out.versions)
    return out


async def respond(res: TrajectoryResult, action: Action, search: SearchFn, codec: TextCodec,
                  limits: AgentLimits, close_ids: list[int]) -> bool:
    """The environment's reply to a turn that neither answered nor ended (mask 0): the search's
    observation, or the invalid-action message. False when the search failed (the trajectory ends with
    its finish reason and error)."""
    remaining = token_room(res, limits)
    if action.kind != "search":  # invalid action (no complete <search>/<answer>)
        res.add_env(codec.encode(INVALID_ACTION_MESSAGE)[:remaining])
        return True
    t1 = time.perf_counter()
    try:
        hits = await search(action.content)
    except Exception as exc:  # noqa: BLE001 - the environment failed: end the trajectory, keep what we have
        res.search_seconds += time.perf_counter() - t1
        res.finish_reason = search_failure_reason(exc)
        res.error = f"search failed: {exc}"
        return False
    res.search_seconds += time.perf_counter() - t1
    res.num_searches += 1
    obs_ids = codec.encode(observation_for([h.contents for h in hits]))
    obs_ids, cut = truncate_observation(obs_ids, close_ids, min(limits.max_obs_tokens, remaining))
    res.obs_truncations += int(cut)
    res.add_env(obs_ids)
    return True


async def run_trajectory(
    prompt_ids: Sequence[int],
    generator: Generator,
    codec: TextCodec,
    search: SearchFn,
    limits: AgentLimits,
    sampling: Sampling | None = None,
    request_id: str = "traj",
    opened: str = "",
) -> TrajectoryResult:
    """Roll out one trajectory from `prompt_ids` (see the module docstring for the state machine).
    `opened`: assistant text the prompt already ends with (a prefilled `<think>` or `<search>`); the first
    turn's action is parsed on it plus the sampled text, so a tag opened by the prompt counts. `sampling`:
    None samples as `AgentSettings` does by default."""
    sampling = sampling if sampling is not None else Sampling.from_settings(AgentSettings())
    res = TrajectoryResult(prompt_ids=list(prompt_ids))
    close_ids = codec.encode(OBS_CLOSE)
    turn = 0
    while True:
        final = turn >= limits.max_turns
        budget = token_room(res, limits)
        if budget <= 0:
            res.finish_reason = "length"
            return res
        max_tokens = min(limits.max_tokens_per_turn, budget)
        out = await sample_turn(generator, res, sampling, max_tokens, turn, request_id)
        turn += 1
        res.num_turns = turn
        action = parse_action((opened if turn == 1 else "") + out.text)

        if action.kind == "answer":
            res.finish_reason, res.answer = "answer", action.content
            return res
        if out.finish == "length" and max_tokens == budget:
            res.finish_reason = "length"
            return res
        if out.finish == "eos":
            res.finish_reason = "max_turns" if final and action.kind == "search" else "eos"
            return res
        if final:  # the last turn may only answer (Search-R1: do_search=False)
            res.finish_reason = "max_turns"
            return res
        if not await respond(res, action, search, codec, limits, close_ids):
            return res
