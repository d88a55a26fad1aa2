"""The run's trajectory archive as the viewer reads it: a per-part summary of the scalar columns (cached,
refreshed when a part changes), paged and filtered listings, single trajectories read by predicate.

Never loads the archive whole: the summary projects the scalar columns, plus the response text one part
at a time to compute its health features and drop it; a trajectory page reads the rows of one
`(step, task_id)` from one part. The layout is the learner's (`{dir}/part-{seq:06d}.parquet`, one row per
trajectory); new parts of a live run, and the open part rewritten at each step, are picked up on the
next request.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pyarrow.parquet as pq

from searchr1.core.health import text_features

PART_RE = re.compile(r"^part-(\d{6})\.parquet$")
SCALARS = ("step", "policy_version", "task_id", "question", "data_source", "worker_id", "index", "reward",
           "reward_components", "finish_reason", "num_turns", "num_searches")
"""Archive columns the summary projects (plus `response_text` and `loss_mask` for features, dropped)."""
SUMMARY_VERSION = 1
"""Bumped when the summary's columns change, so stale cached summaries are not read."""
EM_KEYS = ("em", "searchr1_em", "exact_match", "answer_correct")


class ArchiveNotFound(ValueError):
    """No archive parts where the viewer was pointed."""


def find_archive(run_dir: Path) -> Path:
    """The part directory of a run: `RUN_DIR/archive` when it holds parts, else RUN_DIR itself."""
    for d in (run_dir / "archive", run_dir):
        if d.is_dir() and any(PART_RE.match(p.name) for p in d.iterdir()):
            return d
    raise ArchiveNotFound(f"no archive parts (part-NNNNNN.parquet) in {run_dir} or {run_dir / 'archive'}")


def em_of(components: dict[str, float]) -> float | None:
    """The exact-match component of a reward breakdown (`em`, `searchr1_em`, … or `<scorer>.<key>`)."""
    for key in EM_KEYS:
        if key in components:
            return float(components[key])
    for key in EM_KEYS:
        for name, value in components.items():
            if name.endswith("." + key):
                return float(value)
    return None


def summarize_part(path: Path, seq: int) -> pa.Table:
    """One part's summary: the scalar columns, EM, response length in tokens and the health features."""
    t = pq.read_table(path, columns=[*SCALARS, "response_text", "loss_mask"])
    feats = [text_features(x or "") for x in t.column("response_text").to_pylist()]
    ems = [em_of(json.loads(c or "{}")) for c in t.column("reward_components").to_pylist()]
    n = t.num_rows
    out = t.drop_columns(["response_text", "loss_mask", "reward_components"])
    extra = {
        "em": pa.array(ems, pa.float64()),
        "response_tokens": pc.list_value_length(t.column("loss_mask")).cast(pa.int32()),
        "malformed": pa.array([f.malformed for f in feats], pa.bool_()),
        "queries": pa.array([f.queries for f in feats], pa.int32()),
        "repeated_queries": pa.array([f.repeated_queries for f in feats], pa.int32()),
        "answer_words": pa.array([f.answer_words for f in feats], pa.int32()),
        "think_words": pa.array([f.think_words for f in feats], pa.int32()),
        "part": pa.array([seq] * n, pa.int32()),
        "row": pa.array(range(n), pa.int32()),
    }
    for name, col in extra.items():
        out = out.append_column(name, col)
    return out


def latest_only(table: pa.Table) -> pa.Table:
    """Keep, for each `(step, task_id)` archived twice (a learner restarted between archive and
    checkpoint), the copy of the highest part: the one the run kept."""
    last: dict[tuple[int, str], int] = {}
    keys = list(zip(table.column("step").to_pylist(), table.column("task_id").to_pylist()))
    parts = table.column("part").to_pylist()
    for k, p in zip(keys, parts):
        last[k] = max(p, last.get(k, p))
    if all(last[k] == p for k, p in zip(keys, parts)):
        return table
    return table.filter(pa.array([last[k] == p for k, p in zip(keys, parts)], pa.bool_()))


@dataclass(frozen=True)
class Query:
    """Listing filters; None = any."""

    min_step: int | None = None
    max_step: int | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    finish_reason: str | None = None
    searches: int | None = None
    data_source: str | None = None
    text: str | None = None
    task_id: str | None = None


class SummaryCache:
    """Part summaries on disk (Arrow IPC files under `directory`), keyed by the part's absolute path, size
    and modification time, so a run opens fast the second time; a part rewritten by a live learner gets a
    new key (its old file is removed)."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)

    def _prefix(self, part: Path) -> str:
        return hashlib.sha256(str(part.resolve()).encode()).hexdigest()[:20]

    def _file(self, part: Path, stamp: tuple[int, int]) -> Path:
        return self.dir / f"{self._prefix(part)}-{stamp[0]}-{stamp[1]}-v{SUMMARY_VERSION}.arrow"

    def get(self, part: Path, stamp: tuple[int, int]) -> pa.Table | None:
        f = self._file(part, stamp)
        try:
            return feather.read_table(f) if f.is_file() else None
        except (OSError, pa.ArrowInvalid):
            return None

    def put(self, part: Path, stamp: tuple[int, int], table: pa.Table) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            for old in self.dir.glob(self._prefix(part) + "-*.arrow"):
                old.unlink(missing_ok=True)
            f = self._file(part, stamp)
            tmp = f.with_name(f".{f.name}.tmp")
            feather.write_feather(table, tmp, compression="zstd")
            tmp.replace(f)
        except OSError:
            pass  # a read-only or full cache directory only costs speed


PART_ERRORS: tuple[type[BaseException], ...] = (OSError, pa.ArrowException, KeyError, ValueError)
"""What reading a damaged part raises (a truncated file, bad Parquet, missing columns)."""


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:160] or type(exc).__name__


class ArchiveStore:
    """Thread-safe cache of part summaries over one archive directory (in memory, and on disk when a
    cache directory is given). A part that cannot be read (truncated, not Parquet, missing columns) is
    left out and listed in `broken` (name → reason), so one damaged part costs its own rows, not every
    page."""

    def __init__(self, directory: Path, cache_dir: Path | None = None) -> None:
        self.dir = Path(directory)
        self.disk = SummaryCache(cache_dir) if cache_dir is not None else None
        self._cache: dict[Path, tuple[tuple[int, int], pa.Table]] = {}
        self._lock = threading.Lock()
        self._summary: pa.Table | None = None
        self._key: tuple = ()
        self.broken: dict[str, str] = {}
        """Parts left out of the last summary, with why."""

    def parts(self) -> list[tuple[int, Path]]:
        found = [(int(m.group(1)), p) for p in self.dir.iterdir() if (m := PART_RE.match(p.name))]
        return sorted(found)

    def summary(self) -> pa.Table:
        """Every trajectory's summary row (latest copies only), refreshed for parts that changed."""
        with self._lock:
            current = []
            broken: dict[str, str] = {}
            for seq, p in self.parts():
                try:
                    st = p.stat()
                    stamp = (st.st_mtime_ns, st.st_size)
                    cached = self._cache.get(p)
                    if cached is None or cached[0] != stamp:
                        self._cache[p] = (stamp, self._summarize(p, seq, stamp))
                except PART_ERRORS as exc:
                    broken[p.name] = _reason(exc)
                    self._cache.pop(p, None)
                    continue
                current.append((p, stamp))
            self.broken = broken
            key = tuple(current)
            if self._summary is None or key != self._key:
                tables = [self._cache[p][1] for p, _ in current]
                if not tables:
                    why = f" ({len(broken)} part(s) unreadable: {next(iter(broken.values()))})" if broken else ""
                    raise ArchiveNotFound(f"no readable archive parts in {self.dir}{why}")
                self._summary = latest_only(pa.concat_tables(tables))
                self._key = key
            return self._summary

    def _summarize(self, part: Path, seq: int, stamp: tuple[int, int]) -> pa.Table:
        table = self.disk.get(part, stamp) if self.disk else None
        if table is None:
            table = summarize_part(part, seq)
            if self.disk:
                self.disk.put(part, stamp, table)
        return table

    def path_of(self, seq: int) -> Path:
        return self.dir / f"part-{seq:06d}.parquet"

    def text_mask(self, table: pa.Table, text: str) -> pa.Array:
        """Rows of `table` whose question or response contains `text` (case-insensitive), read part by part."""
        hits: set[tuple[int, int]] = set()
        for seq in sorted(set(table.column("part").to_pylist())):
            try:
                t = pq.read_table(self.path_of(seq), columns=["question", "response_text"])
            except PART_ERRORS as exc:
                self.broken[self.path_of(seq).name] = _reason(exc)
                continue
            m = pc.or_(pc.match_substring(t.column("question"), text, ignore_case=True),
                       pc.match_substring(t.column("response_text"), text, ignore_case=True))
            hits.update((seq, i) for i in pc.indices_nonzero(pc.fill_null(m, False)).to_pylist())
        return pa.array([(p, r) in hits for p, r in zip(table.column("part").to_pylist(),
                                                        table.column("row").to_pylist())], pa.bool_())

    def select(self, q: Query) -> pa.Table:
        """The summary rows matching `q`, ordered by step then task then index."""
        t = self.summary()
        mask = pa.array([True] * t.num_rows, pa.bool_())
        for col, op, value in (("step", pc.greater_equal, q.min_step), ("step", pc.less_equal, q.max_step),
                               ("reward", pc.greater_equal, q.min_reward), ("reward", pc.less_equal, q.max_reward),
                               ("finish_reason", pc.equal, q.finish_reason), ("num_searches", pc.equal, q.searches),
                               ("data_source", pc.equal, q.data_source), ("task_id", pc.equal, q.task_id)):
            if value is not None:
                mask = pc.and_(mask, op(t.column(col), value))
        t = t.filter(mask)
        if q.text:
            t = t.filter(self.text_mask(t, q.text))
        return t.sort_by([("step", "ascending"), ("task_id", "ascending"), ("index", "ascending")])

    def trajectories(self, part: int, step: int, task_id: str) -> list[dict[str, Any]]:
        """Every column of the rows of one group (one `(step, task_id)` in one part), in group order."""
        path = self.path_of(part)
        if not path.is_file():
            return []
        try:
            t = pq.read_table(path, filters=[("step", "=", step), ("task_id", "=", task_id)])
        except PART_ERRORS as exc:
            self.broken[path.name] = _reason(exc)
            return []
        return sorted(t.to_pylist(), key=lambda r: r["index"])
