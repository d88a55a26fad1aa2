"""The task ids a run has trained on, as a checkpoint stores them: sorted, newline-joined, zlib-compressed
and base64-encoded in `state.json` (`consumed_z`, with `consumed_count`). Task ids share long prefixes
(`{dataset id}@e{epoch}`), so 850,000 of them take about 2.6 MB instead of the 18 MB of a JSON list.
`decode` also reads the JSON list (`consumed`) that older checkpoints hold.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable
from typing import Any


def encode(ids: Iterable[str]) -> dict[str, Any]:
    """`state.json` fields for `ids` (no id may contain a newline: task ids cannot)."""
    ordered = sorted(ids)
    if any("\n" in i for i in ordered):
        raise ValueError("a task id contains a newline")
    blob = zlib.compress("\n".join(ordered).encode(), 6)
    return {"consumed_z": base64.b64encode(blob).decode("ascii"), "consumed_count": len(ordered)}


def decode(meta: dict[str, Any]) -> set[str]:
    """The task ids of a `state.json` (either encoding; none: empty)."""
    if "consumed_z" in meta:
        text = zlib.decompress(base64.b64decode(meta["consumed_z"])).decode()
        ids = set(text.split("\n")) if text else set()
        if len(ids) != int(meta.get("consumed_count", len(ids))):
            raise ValueError(f"consumed task ids: {len(ids)} decoded, {meta['consumed_count']} recorded")
        return ids
    return set(meta.get("consumed", []))
