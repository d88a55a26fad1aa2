"""A real redis-server started with `--requirepass` accepts our client with the password in the URL and
refuses it without (or with a wrong one), through the same `connect` and `TypedStream` the services use."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
from redis.exceptions import AuthenticationError

from searchr1.core.redis_server import find_redis_server
from searchr1.core.schemas import Task
from searchr1.core.servers import free_port
from searchr1.streams import StreamKeys, TypedStream, connect

PASSWORD = "r3dis-pw"


@pytest.fixture
def protected_redis(tmp_path):
    port = free_port()
    proc = subprocess.Popen([find_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path), "--requirepass", PASSWORD],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("redis-server with --requirepass did not start") from None
            time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(10)


async def test_password_in_the_url_is_required(protected_redis):
    port = protected_redis
    for url in (f"redis://127.0.0.1:{port}/0", f"redis://:wrong@127.0.0.1:{port}/0"):
        client = connect(url)
        try:
            with pytest.raises(AuthenticationError):
                await client.ping()
        finally:
            await client.aclose()
    client = connect(f"redis://:{PASSWORD}@127.0.0.1:{port}/0")
    try:
        assert await client.ping()
        keys = StreamKeys("auth")
        stream = TypedStream(client, keys.tasks, Task, "rollout", dead_key=keys.dead)
        await stream.ensure_group()
        await stream.publish(Task(task_id="t1", question="q?", golden_answers=["a"]))
        got = await stream.read("c1")
        assert [e.value.task_id for e in got] == ["t1"]
    finally:
        await client.aclose()
