"""Reward service throughput: items/s of the Search-R1 EM scorers through HTTP (the real server started as a
subprocess through `searchr1.reward.app.serve`, the entry point of `searchr1 serve reward`, scored through `RewardClient`) at batch 1 and 256, against the
same scorers called in-process in this run (the baseline: what the HTTP hop costs).

Rows: in-process pure functions (baseline); `RewardClient` (httpx) with 1 or more requests in flight;
and the same requests written on one raw keep-alive socket (no client library), which isolates the
server's own cost per request from the client's.

Items are realistic: the Search-R1 prompt in Qwen's chat template plus a two-search response with
three retrieved docs per search (~3 kB of text per item).

    .venv/bin/python benchmarks/reward.py [--seconds 3] [--concurrency 1 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

import httpx

from searchr1.core.clients.reward import RewardClient, ScoreItem
from searchr1.core.protocol import make_prompt, observation_for
from searchr1.core.servers import free_port
from searchr1.core.settings import RetrySettings
from searchr1.reward import scoring

SCORERS = ("searchr1_em", "searchr1_subem", "searchr1_em_format")
DOC = ("Paris\nParis is the capital and most populous city of France. With an estimated population of "
       "2,102,650 residents in January 2023 in an area of more than 105 km2, Paris is the fourth-most "
       "populous city in the European Union and the 30th most densely populated city in the world in 2022.")


def make_items(n: int) -> list[ScoreItem]:
    prompt = (f"<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
              f"<|im_start|>user\n{make_prompt('what is the capital of france')}<|im_end|>\n<|im_start|>assistant\n")
    obs = observation_for([DOC, DOC.replace("Paris", "Lyon"), DOC.replace("France", "Texas")])
    items = []
    for i in range(n):
        answer = "Paris" if i % 2 == 0 else "Lyon"
        response = ("<think>I need to find the capital of France.</think>\n<search> capital of france </search>"
                    + obs + "<think>Let me check once more.</think>\n<search> paris capital </search>" + obs
                    + f"<think>The documents say Paris.</think>\n<answer> {answer} </answer><|im_end|>")
        items.append(ScoreItem(prompt=prompt, response=response, golden_answers=["Paris", "City of Paris"]))
    return items


def in_process(scorer: str, items: list[ScoreItem], seconds: float) -> float:
    fn = {"searchr1_em": scoring.searchr1_em, "searchr1_subem": scoring.searchr1_subem,
          "searchr1_em_format": scoring.searchr1_em_format}[scorer]
    pairs = [(it.full_text, {"target": it.golds}) for it in items]
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for text, gt in pairs:
            fn(text, gt)
        done += len(pairs)
    return done / (time.perf_counter() - t0)


async def over_http(url: str, scorer: str, items: list[ScoreItem], batch: int, concurrency: int,
                    seconds: float) -> float:
    batches = [items[i:i + batch] for i in range(0, len(items), batch)]
    done = 0
    async with RewardClient(url, retry=RetrySettings(timeout_s=60)) as client:
        await client.score(scorer, batches[0])  # warm-up
        t0 = time.perf_counter()

        async def worker(k: int) -> None:
            nonlocal done
            j = k
            while time.perf_counter() - t0 < seconds:
                result = await client.score(scorer, batches[j % len(batches)])
                done += len(result.scores)
                j += concurrency

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
        return done / (time.perf_counter() - t0)


async def raw_http(port: int, scorer: str, items: list[ScoreItem], batch: int, seconds: float) -> float:
    """The same requests over one keep-alive HTTP/1.1 socket with no client library: the server's share."""
    bodies = []
    for i in range(0, len(items), batch):
        payload = {"scorer": scorer, "items": [it.model_dump(mode="json", exclude_none=True)
                                               for it in items[i:i + batch]]}
        body = json.dumps(payload).encode()
        bodies.append(b"POST /v1/score HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done, j, t0 = 0, 0, time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            writer.write(bodies[j % len(bodies)])
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            done += min(batch, len(items))
            j += 1
    finally:
        writer.close()
    return done / (time.perf_counter() - t0)


def start_server(port: int) -> subprocess.Popen:
    env = {**os.environ, "REWARD_WORKERS": "2", "REWARD_INLINE_MAX_ITEMS": "32", "REWARD_LOG_LEVEL": "warning"}
    # the same entry point as `searchr1 serve reward --port N`, without loading the other services' CLIs
    code = ("import asyncio; from searchr1.core.settings import load_settings; from searchr1.reward.app import serve; "
            f"from searchr1.reward.settings import RewardSettings; asyncio.run(serve(load_settings(RewardSettings, port={port})))")
    proc = subprocess.Popen([sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not become healthy")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="Measuring time per configuration.")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="Requests in flight at batch 1.")
    args = ap.parse_args()
    items = make_items(512)
    chars = sum(len(it.full_text) for it in items) / len(items)
    port = free_port()
    proc = start_server(port)
    url = f"http://127.0.0.1:{port}"
    print(f"reward benchmark: {len(items)} distinct items, {chars:.0f} chars each (prompt+response); "
          f"server subprocess with REWARD_WORKERS=2 (scoring thread pool), REWARD_INLINE_MAX_ITEMS=32; "
          f"client in this process; {os.cpu_count()} CPUs (shared); {args.seconds:.1f} s per row")
    print(f"{'scorer':<20} {'mode':<28} {'items/s':>10} {'vs in-process':>14}")
    try:
        for scorer in SCORERS:
            base = in_process(scorer, items, args.seconds)
            print(f"{scorer:<20} {'in-process (baseline)':<28} {base:>10.0f} {'1.00x':>14}")
            rows = [(1, c) for c in args.concurrency] + [(256, 1), (256, 2)]
            for batch, conc in rows:
                rate = asyncio.run(over_http(url, scorer, items, batch, conc, args.seconds))
                print(f"{scorer:<20} {f'HTTP batch {batch}, {conc} in flight':<28} {rate:>10.0f} "
                      f"{rate / base:>13.2f}x")
            for batch in (1, 256):
                rate = asyncio.run(raw_http(port, scorer, items, batch, args.seconds))
                print(f"{scorer:<20} {f'raw socket batch {batch} (server)':<28} {rate:>10.0f} {rate / base:>13.2f}x")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
