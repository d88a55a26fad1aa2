"""The status line of `searchr1 up`: step, reward mean, EM, searches per question, queue depths and the
weight version, in one line.

`render_status` is pure (a `StatusSnapshot` in, a string out; a missing number shows as `–`), and
`pick_number` / `numbers_from_record` / `numbers_from_prometheus` turn the learner's JSONL record or its
Prometheus text into numbers by configurable key lists, since the launcher does not import the learner.
`StatusCollector` gathers a snapshot: the last record of the learner's JSONL log (missing file → blanks),
then a scrape of the learner's `/metrics` for what the JSONL lacks, then Redis (queue lag/pending of the
`tasks` and `trajectories` streams through `searchr1.streams`, and `searchr1.weightsync.latest`).
Every source may fail at any time — a failed source only blanks its numbers.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

DASH = "–"
LEARNER_FIELDS = ("step", "reward_mean", "em", "searches_per_question")


@dataclass(frozen=True)
class StatusSnapshot:
    """The numbers on the status line; None = unknown (shown as `–`)."""

    step: float | None = None
    reward_mean: float | None = None
    em: float | None = None
    searches_per_question: float | None = None
    tasks_lag: int | None = None
    """Tasks not yet delivered to any rollout worker."""
    tasks_pending: int | None = None
    """Tasks delivered to a worker and not yet acked."""
    trajectories_lag: int | None = None
    """Trajectory groups not yet read by the learner."""
    trajectories_pending: int | None = None
    """Trajectory groups read by the learner and not yet acked."""
    weight_version: int | None = None
    elapsed_s: float | None = None


def _num(value: float | None, spec: str) -> str:
    if value is None:
        return DASH
    return format(value, spec)


def _int(value: float | None) -> str:
    return DASH if value is None else str(int(value))


def _elapsed(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    s = int(seconds)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def render_status(s: StatusSnapshot) -> str:
    """One status line, e.g.
    `step 12 · reward 0.412 · EM 0.375 · searches/q 1.25 · tasks 3+2 · trajectories 0+1 · weights v12 · 1:05`
    where queues show `lag+pending` (undelivered + delivered but unacked)."""
    return " · ".join([
        f"step {_int(s.step)}",
        f"reward {_num(s.reward_mean, '.3f')}",
        f"EM {_num(s.em, '.3f')}",
        f"searches/q {_num(s.searches_per_question, '.2f')}",
        f"tasks {_int(s.tasks_lag)}+{_int(s.tasks_pending)}",
        f"trajectories {_int(s.trajectories_lag)}+{_int(s.trajectories_pending)}",
        f"weights {DASH if s.weight_version is None else 'v' + str(s.weight_version)}",
        _elapsed(s.elapsed_s),
    ])


def pick_number(record: Mapping[str, Any], keys: list[str]) -> float | None:
    """The first of `keys` in `record` holding a finite number (bools and strings do not count)."""
    for key in keys:
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            return float(value)
    return None


def numbers_from_record(record: Mapping[str, Any], keys: Mapping[str, list[str]]) -> dict[str, float]:
    """Status fields found in one JSONL record, by the candidate keys of each field."""
    out = {}
    for name, candidates in keys.items():
        value = pick_number(record, candidates)
        if value is not None:
            out[name] = value
    return out


def numbers_from_prometheus(text: str, names: Mapping[str, list[str]]) -> dict[str, float]:
    """Status fields found in Prometheus exposition text, by candidate sample names (the first sample of
    a name wins). Unparseable text gives {}."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, sample.value)
    except (ValueError, TypeError, IndexError):
        return {}
    return numbers_from_record(samples, names)


def merge_learner_numbers(from_jsonl: Mapping[str, float], from_prometheus: Mapping[str, float]) -> dict[str, float]:
    """The learner's numbers: the JSONL record's, then /metrics for what it lacks — except that while the
    scraped step is 0 (nothing trained yet) the scraped gauges are ignored: gauges start at 0, which
    would read as a real reward/EM of 0."""
    merged = dict(from_jsonl)
    untrained = from_prometheus.get("step", 0.0) == 0.0
    for key, value in from_prometheus.items():
        if key in merged or (untrained and key != "step"):
            continue
        merged[key] = value
    return merged


def last_jsonl_record(path: Path, max_bytes: int = 256 * 1024) -> dict[str, Any] | None:
    """The last complete JSON object line of a JSONL file; None if missing, empty or unreadable."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return None
    for line in reversed(data.splitlines()):
        try:
            record = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            return record
    return None


class StatusCollector:
    """Gathers a `StatusSnapshot` from the learner's JSONL and /metrics and from Redis."""

    def __init__(self, *, redis_url: str | None, run: str, metrics_jsonl: Path | None,
                 learner_metrics_url: str | None, jsonl_keys: Mapping[str, list[str]],
                 prometheus_names: Mapping[str, list[str]], started_at: float | None = None) -> None:
        self.redis_url = redis_url
        self.run = run
        self.metrics_jsonl = metrics_jsonl
        self.learner_metrics_url = learner_metrics_url
        self.jsonl_keys = jsonl_keys
        self.prometheus_names = prometheus_names
        self.started_at = time.monotonic() if started_at is None else started_at
        self.scrape_learner = False
        """Set once the learner is up (before that its port may belong to nobody)."""
        self._redis = None

    async def collect(self) -> StatusSnapshot:
        from_jsonl: dict[str, float] = {}
        if self.metrics_jsonl is not None:
            record = last_jsonl_record(self.metrics_jsonl)
            if record is not None:
                from_jsonl = numbers_from_record(record, self.jsonl_keys)
        scraped: dict[str, float] = {}
        if self.scrape_learner and self.learner_metrics_url and any(f not in from_jsonl for f in LEARNER_FIELDS):
            scraped = await self._scrape()
        numbers: dict[str, Any] = merge_learner_numbers(from_jsonl, scraped)
        numbers.update(await self._queues())
        snap = StatusSnapshot(elapsed_s=time.monotonic() - self.started_at)
        known = {f.name for f in fields(StatusSnapshot)}
        return replace(snap, **{k: v for k, v in numbers.items() if k in known})

    async def _scrape(self) -> dict[str, float]:
        import httpx

        try:
            async with httpx.AsyncClient(timeout=1.0, trust_env=False) as client:
                resp = await client.get(self.learner_metrics_url)  # type: ignore[arg-type]
        except httpx.HTTPError:
            return {}
        if resp.status_code != 200:
            return {}
        return numbers_from_prometheus(resp.text, self.prometheus_names)

    async def _queues(self) -> dict[str, int]:
        if not self.redis_url:
            return {}
        from redis.exceptions import RedisError

        from searchr1.streams import StreamKeys, connect, tasks_stream, trajectories_stream
        from searchr1.weightsync import latest

        if self._redis is None:
            self._redis = connect(self.redis_url)
        keys = StreamKeys(self.run)
        out: dict[str, int] = {}
        streams = {
            "tasks": tasks_stream(self._redis, keys),
            "trajectories": trajectories_stream(self._redis, keys),
        }
        # no stream or group yet, or Redis gone: that number is unknown
        for name, stream in streams.items():
            for what in ("lag", "pending"):
                with contextlib.suppress(RedisError, OSError):
                    out[f"{name}_{what}"] = int(await getattr(stream, what)())
        with contextlib.suppress(RedisError, OSError):
            version = await latest(self._redis, keys)
            if version is not None:
                out["weight_version"] = version.version
        return out

    async def close(self) -> None:
        from redis.exceptions import RedisError

        if self._redis is not None:
            with contextlib.suppress(RedisError, OSError):  # closing a client of a stopped server
                await self._redis.aclose()
            self._redis = None
