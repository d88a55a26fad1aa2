"""`searchr1 rollout once`: one trajectory for one question through a real engine and retriever, printed
for a person to read (think, search, information and answer, each in its own colour)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from searchr1.core.commandline import EXIT_FAILED, error
from searchr1.core.protocol import tag_segments
from searchr1.rollout.agent import AgentLimits, Sampling, TrajectoryResult

if TYPE_CHECKING:
    from searchr1.rollout.settings import RolloutSettings

TAG_STYLES = {"think": "italic cyan", "search": "bold yellow", "information": "dim green",
              "answer": "bold magenta"}


def styled_segments(text: str) -> list[tuple[str, str]]:
    """Split a response into (segment, style) pairs by Search-R1 tag (untagged text: no style)."""
    return [(segment, TAG_STYLES[tag] if tag else "") for segment, tag in tag_segments(text)]


@dataclass(frozen=True)
class OnceRequest:
    """One question, and the settings of the worker that answers it: `settings.model` (the policy),
    `engine`, `agent` (limits, sampling, template) and `retriever` (addresses, `top_k`, retries)."""

    question: str
    settings: RolloutSettings
    seed: int
    steer: bool


async def sample_once(req: OnceRequest) -> tuple[str, str, TrajectoryResult]:
    """Start an engine on `req.model`, run one trajectory; returns the prompt, the response and the result."""
    from searchr1.core.clients.http_retriever import retriever_client
    from searchr1.core.protocol import render_prompt
    from searchr1.rollout.agent import run_trajectory
    from searchr1.rollout.engine import HfCodec
    from searchr1.rollout.service import start_generator

    s = req.settings
    engine = s.engine
    if req.steer:
        engine = engine.model_copy(update={
            "logits_processors": [*engine.logits_processors, "searchr1.rollout.tools.steering:SearchSteering"]})
    generator = await start_generator(s.model, engine)
    client = retriever_client(s.retriever.addresses, token=s.retriever.token, retry=s.retriever.retry_policy())
    limits = AgentLimits.from_settings(s.agent, max_context_tokens=engine.max_model_len)
    try:
        tokenizer = generator.tokenizer()  # type: ignore[attr-defined]
        codec = HfCodec(tokenizer)
        prompt = render_prompt(req.question, tokenizer, s.agent.template)
        sampling = Sampling.from_settings(s.agent, seed=req.seed)
        if req.steer:
            from searchr1.rollout.tools.steering import steer_args, word_tokens

            extra = steer_args(tokenizer, max_searches=limits.max_turns, search_tokens=word_tokens(tokenizer))
            sampling = Sampling(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                seed=sampling.seed, extra_args=extra)

        async def search(q: str):
            return (await client.search([q], s.retriever.top_k))[0]

        res = await run_trajectory(codec.encode(prompt), generator, codec, search, limits, sampling, "once")
        return prompt, codec.decode(res.response_ids), res
    finally:
        await client.close()
        await generator.close()


def run_once(req: OnceRequest) -> int:
    """Sample one trajectory and print it colourised; returns the exit code."""
    import asyncio

    from rich.console import Console
    from rich.text import Text

    prompt, response, res = asyncio.run(sample_once(req))
    console = Console()
    console.rule("prompt")
    console.print(Text(prompt, style="dim"))
    console.rule("trajectory")
    text = Text()
    for segment, style in styled_segments(response):
        text.append(segment, style=style or None)
    console.print(text)
    console.rule()
    console.print(f"finish: [bold]{res.finish_reason}[/]  turns: {res.num_turns}  searches: {res.num_searches}  "
                  f"sampled tokens: {res.generated_tokens}  environment tokens: {res.env_tokens}  "
                  f"answer: [bold magenta]{res.answer!r}[/]", highlight=False)
    if res.error is not None:  # the environment failed the trajectory: say why, and fail
        return error(res.error, EXIT_FAILED)
    return 0
