"""A scripted engine for a real rollout worker in tests that exercise its streams, not its model: every
turn answers `<answer> a </answer>` (token ids from the given tokenizer), after `delay_s`."""

from __future__ import annotations

import asyncio

from searchr1.rollout.engine import TurnOutput, TurnRequest

ANSWER = "<answer> a </answer>"


class ScriptedEngine:
    def __init__(self, tokenizer, delay_s: float = 0.0) -> None:
        self.ids = tokenizer.encode(ANSWER, add_special_tokens=False)
        self.delay_s = delay_s

    async def generate(self, request: TurnRequest, request_id: str) -> TurnOutput:
        await asyncio.sleep(self.delay_s)
        return TurnOutput(list(self.ids), [-1.0] * len(self.ids), ANSWER, "stop", "</answer>")

    async def reload(self, path, digest=None) -> None:
        pass

    async def close(self) -> None:
        pass
