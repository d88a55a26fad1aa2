"""The committed warm start is the one its warmstart.json describes (digest over every other file)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from searchr1.weightsync import snapshot_digest

ASSET = Path(__file__).resolve().parents[2] / "assets" / "tiny-world" / "warmstart"


def test_committed_warmstart_matches_its_record(tmp_path):
    record = json.loads((ASSET / "warmstart.json").read_text())
    copy = tmp_path / "w"
    shutil.copytree(ASSET, copy)
    (copy / "warmstart.json").unlink()
    assert snapshot_digest(copy) == record["sha256"]
    assert record["world_seed"] == 0 and record["steps"] >= 1
    assert (ASSET / "config.json").is_file() and (ASSET / "tokenizer.json").is_file()


def test_committed_warmstart_knows_the_current_name_lexicon():
    """The asset's tokenizer must be the one `world build` makes now (one token per name word): a change
    to the generator's lexicon needs a new warm start (assets/tiny-world/README.md)."""
    from transformers import AutoTokenizer

    from searchr1.world.generator import name_lexicon
    from searchr1.world.settings import GeneratorSettings

    tok = AutoTokenizer.from_pretrained(str(ASSET))
    words = name_lexicon(GeneratorSettings().name_words)
    assert len(tok) == 1024 + len(words)
    assert all(len(tok(" " + w, add_special_tokens=False)["input_ids"]) == 1 for w in words)
