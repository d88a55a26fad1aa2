"""Dead letters after a fix, against a real redis-server and through the CLI: `searchr1 streams redrive`
requeues the selected dead letters (by stream and reason) on their source stream, where a consumer reads
and processes them; `searchr1 streams dead` prints reasons as plain text, never as rich markup."""

from __future__ import annotations

import asyncio

from typer.testing import CliRunner

from searchr1.cli import build_app
from searchr1.core.schemas import Task, encode
from searchr1.streams import StreamKeys, connect, read_dead, tasks_stream

KEYS = StreamKeys("dl")


def _task(i: int) -> Task:
    return Task(task_id=f"t{i}", question=f"q{i}?", golden_answers=["a"])


async def _bury_three(url: str) -> None:
    redis = connect(url)
    try:
        await redis.flushdb()
        s = tasks_stream(redis, KEYS)
        await s.ensure_group()
        await s.publish_many([_task(i) for i in range(3)])
        got = await s.read("w", count=3)
        await s.dead_letter(got[0].id, "rejected by worker v2: unknown field [red]x[/red]")
        await s.dead_letter(got[1].id, "rejected by worker v2: unknown field y")
        await s.dead_letter(got[2].id, "reward service refused")
        await redis.xadd(KEYS.dead, {b"source": KEYS.tasks, b"source_id": b"0-1", b"reason": b"no payload v2",
                                     b"payload": b"", b"at": b"0"})
    finally:
        await redis.aclose()


def test_redrive_requeues_the_selected_dead_letters(redis_server):
    asyncio.run(_bury_three(redis_server.url))
    run = CliRunner().invoke
    app = build_app()
    base = ["streams", "redrive", "--redis", redis_server.url, "--run", "dl", "--source", "tasks"]
    dry = run(app, [*base, "--reason", "worker v2", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "2 dead letter(s) would be requeued" in dry.output
    done = run(app, [*base, "--reason", "worker v2"])
    assert done.exit_code == 0 and "2 dead letter(s) requeued" in done.output

    async def check() -> None:
        redis = connect(redis_server.url)
        try:
            left = await read_dead(redis, KEYS.dead)
            assert sorted(d.reason for d in left) == ["no payload v2", "reward service refused"]
            again = await tasks_stream(redis, KEYS).read("w2", count=10)
            assert [e.value.task_id for e in again] == ["t0", "t1"]  # readable, processed as new entries
            assert again[0].value == _task(0) and encode(again[1].value) == encode(_task(1))
        finally:
            await redis.aclose()

    asyncio.run(check())


def test_dead_prints_reasons_as_plain_text(redis_server):
    asyncio.run(_bury_three(redis_server.url))
    out = CliRunner().invoke(build_app(), ["streams", "dead", "--redis", redis_server.url, "--run", "dl"])
    assert out.exit_code == 0, out.output
    assert "unknown field [red]x[/red]" in out.output  # the markup shown, not interpreted
