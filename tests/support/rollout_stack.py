"""The real components a rollout worker talks to, started in-process on loopback port 0 for the rollout
integration test and `benchmarks/rollout.py`: a BM25 retriever (gRPC) over a small corpus, the reward
service (HTTP) and a vLLM CPU engine on the tiny model with the steering logits processor loaded.
(Tests may import any service; product code in services/rollout never imports these.)"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS = [
    ("Paris", "Paris is the capital and most populous city of France."),
    ("Berlin", "Berlin is the capital and largest city of Germany."),
    ("Rome", "Rome is the capital city of Italy."),
    ("Madrid", "Madrid is the capital and most populous city of Spain."),
    ("Lisbon", "Lisbon is the capital and largest city of Portugal."),
    ("Vienna", "Vienna is the capital of Austria, on the river Danube."),
    ("Danube", "The Danube is the second-longest river in Europe."),
    ("Everest", "Mount Everest is the highest mountain above sea level."),
    ("Tokyo", "Tokyo is the capital of Japan."),
    ("Nile", "The Nile is a major north-flowing river in Africa."),
    ("Jane Austen", "Jane Austen wrote the novel Pride and Prejudice in 1813."),
    ("Golden Gate Bridge", "The Golden Gate Bridge was opened in 1937 in San Francisco."),
]

QUESTIONS = [
    ("what is the capital of france", ["Paris"]),
    ("what is the capital of germany", ["Berlin"]),
    ("which river flows through vienna", ["Danube"]),
    ("who wrote pride and prejudice", ["Jane Austen"]),
    ("when was the golden gate bridge opened", ["1937"]),
    ("what is the highest mountain", ["Mount Everest", "Everest"]),
]


def write_corpus(path: Path) -> Path:
    with path.open("w") as f:
        for i, (title, text) in enumerate(CORPUS):
            f.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'}) + "\n")
    return path


@dataclass
class Retriever:
    running: Any

    @property
    def address(self) -> str:
        return self.running.grpc_address

    async def stop(self) -> None:
        await self.running.stop()


async def start_retriever(workdir: Path) -> Retriever:
    """Build a BM25 index over `CORPUS` and serve it over gRPC on a free port."""
    import asyncio

    from searchr1.retriever.builder import build_index
    from searchr1.retriever.server import open_index
    from searchr1.retriever.server import start_retriever as _start
    from searchr1.retriever.settings import RetrieverSettings

    corpus = write_corpus(workdir / "corpus.jsonl")
    await asyncio.to_thread(build_index, corpus, workdir / "index", "bm25")
    settings = RetrieverSettings(index=workdir / "index", grpc_port=0, http_port=None, metrics_port=None)
    loaded = await asyncio.to_thread(open_index, settings)
    return Retriever(await _start(settings, loaded))


@dataclass
class Reward:
    server: Any

    @property
    def url(self) -> str:
        return self.server.url

    async def stop(self) -> None:
        await self.server.stop()


async def start_reward() -> Reward:
    from searchr1.core.servers import HttpServer
    from searchr1.reward.app import build_service, create_app
    from searchr1.reward.settings import RewardSettings

    service = build_service(RewardSettings(port=0))
    server = HttpServer(create_app(service))
    await server.start()
    return Reward(server)


STEERING = "searchr1.rollout.tools.steering:SearchSteering"


async def start_vllm(model_dir: Path, *, max_num_seqs: int = 256):
    """One vLLM CPU engine on the tiny model, steering processor loaded (inactive unless asked for)."""
    import os

    from searchr1.rollout.settings import EngineSettings
    from searchr1.rollout.vllm_engine import VllmEngineConfig, VllmGenerator

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on the CPU build
    return await VllmGenerator.start(VllmEngineConfig(model=str(model_dir), engine=EngineSettings(
        gpu_memory_utilization=0.05, max_model_len=4096, dtype="float32", max_num_seqs=max_num_seqs,
        logits_processors=[STEERING])))
