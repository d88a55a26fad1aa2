"""`searchr1.retriever.fetch` through `huggingface_hub` against a local hub endpoint (tests/support/hub.py):
parts fetched once, concatenated and checksummed, resumed without asking the hub again, a part that does
not match the hub's sha256 refused; the corpus decompressed. And `convert`: a Flat index rewritten as
HNSW / IVF-PQ answers like the Flat one."""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from searchr1.retriever.fetch import FetchError, fetch_corpus, fetch_index, file_sha256
from tests.support.hub import LocalHub, split_into_parts

PARTS = ("part_aa", "part_ab", "part_ac")


@pytest.fixture()
def online(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The hub client online (the test suite defaults to offline), with its cache under tmp_path."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


@pytest.fixture()
def hub(tmp_path: Path):
    root = tmp_path / "hub"
    blob = np.random.default_rng(0).bytes(300_001)
    split_into_parts(blob, root / "org" / "index", PARTS)
    (root / "org" / "corpus").mkdir(parents=True)
    corpus = b"".join(json.dumps({"id": str(i), "contents": f"T{i}\ntext {i}"}).encode() + b"\n" for i in range(5))
    (root / "org" / "corpus" / "wiki.jsonl.gz").write_bytes(gzip.compress(corpus))
    with LocalHub(root) as h:
        h.blob, h.corpus = blob, corpus  # type: ignore[attr-defined]
        yield h


def test_fetch_concatenates_verifies_and_resumes(online, hub, tmp_path: Path):
    dest = tmp_path / "dl"
    got = fetch_index(dest, repo_id="org/index", parts=PARTS, endpoint=hub.endpoint)
    assert not got.reused and got.path == dest / "e5_Flat.index"
    assert got.path.read_bytes() == hub.blob
    assert got.sha256 == hashlib.sha256(hub.blob).hexdigest() == file_sha256(got.path)
    assert (dest / "e5_Flat.index.sha256").read_text() == f"{got.sha256}  e5_Flat.index\n"
    assert [hub.gets[f"org/index/{p}"] for p in PARTS] == [1, 1, 1]

    again = fetch_index(dest, repo_id="org/index", parts=PARTS, endpoint=hub.endpoint)
    assert again.reused and again.sha256 == got.sha256
    assert sum(hub.gets.values()) == 3  # nothing asked for again

    # the assembled file lost, one part lost: only that part is fetched again
    got.path.unlink()
    (dest / "part_ab").unlink()
    third = fetch_index(dest, repo_id="org/index", parts=PARTS, endpoint=hub.endpoint)
    assert not third.reused and third.sha256 == got.sha256
    assert [hub.gets[f"org/index/{p}"] for p in PARTS] == [1, 2, 1]

    # a changed part no longer matches the record: it is fetched again
    (dest / "part_ac").write_bytes(b"truncated")
    (dest / "e5_Flat.index").unlink()
    fourth = fetch_index(dest, repo_id="org/index", parts=PARTS, endpoint=hub.endpoint)
    assert fourth.sha256 == got.sha256 and hub.gets["org/index/part_ac"] == 2


def test_fetch_refuses_a_part_that_does_not_match_the_hub(online, hub, tmp_path: Path):
    hub.etags["org/index/part_ab"] = "0" * 64
    with pytest.raises(FetchError, match="part_ab: sha256 .* does not match the hub's 0000"):
        fetch_index(tmp_path / "dl", repo_id="org/index", parts=PARTS, endpoint=hub.endpoint)
    assert not (tmp_path / "dl" / "part_ab").exists() and not (tmp_path / "dl" / "e5_Flat.index").exists()


def test_fetch_checks_an_expected_sha256(online, hub, tmp_path: Path):
    with pytest.raises(FetchError, match="is not the expected"):
        fetch_index(tmp_path / "dl", repo_id="org/index", parts=PARTS, endpoint=hub.endpoint,
                    expected_sha256="f" * 64)
    assert not (tmp_path / "dl" / "e5_Flat.index").exists()
    with pytest.raises(ValueError, match="64 hex digits"):
        fetch_index(tmp_path / "dl", repo_id="org/index", parts=PARTS, expected_sha256="abc")
    ok = fetch_index(tmp_path / "dl", repo_id="org/index", parts=PARTS, endpoint=hub.endpoint,
                     expected_sha256=hashlib.sha256(hub.blob).hexdigest(), keep_parts=False)
    assert ok.path.read_bytes() == hub.blob and not any((tmp_path / "dl" / p).exists() for p in PARTS)


def test_fetch_corpus_decompresses(online, hub, tmp_path: Path):
    got = fetch_corpus(tmp_path / "dl", repo_id="org/corpus", filename="wiki.jsonl.gz", endpoint=hub.endpoint)
    assert got.path == tmp_path / "dl" / "wiki.jsonl" and got.path.read_bytes() == hub.corpus
    assert got.sha256 == hashlib.sha256(hub.corpus).hexdigest()
    again = fetch_corpus(tmp_path / "dl", repo_id="org/corpus", filename="wiki.jsonl.gz", endpoint=hub.endpoint)
    assert again.reused and hub.gets["org/corpus/wiki.jsonl.gz"] == 1


def test_missing_file_on_the_hub_is_an_error(online, hub, tmp_path: Path):
    from huggingface_hub.errors import EntryNotFoundError

    with pytest.raises(EntryNotFoundError):
        fetch_index(tmp_path / "dl", repo_id="org/index", parts=("part_zz",), endpoint=hub.endpoint)


# --- convert ---------------------------------------------------------------------------------------------


def _flat_dir(tmp_path: Path, n: int = 400, dim: int = 16) -> tuple[Path, np.ndarray]:
    import faiss

    from searchr1.retriever.builder import import_faiss_index
    from searchr1.retriever.encoders import EncoderSpec

    rng = np.random.default_rng(1)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = faiss.IndexFlatIP(dim)
    index.add(vecs)
    faiss.write_index(index, str(tmp_path / "flat.index"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"t{i}\nx"}) + "\n" for i in range(n)))
    m = import_faiss_index(tmp_path / "flat.index", corpus, tmp_path / "flat", EncoderSpec("enc", "e5"))
    assert (m.kind, m.dim, m.metric, m.encoder["convention"]) == ("flat", dim, "ip", "e5")
    return tmp_path / "flat", vecs


@pytest.mark.parametrize("kind", ["hnsw", "ivfpq"])
def test_convert_flat(tmp_path: Path, kind: str):
    import faiss

    from searchr1.retriever.convert import convert_index
    from searchr1.retriever.indexes import FaissParams
    from searchr1.retriever.manifest import Manifest

    src, vecs = _flat_dir(tmp_path)
    m = convert_index(src, tmp_path / kind, kind, params=replace(FaissParams.of(), ivf_nlist=4, ivf_nprobe=4, pq_m=4), block=64)
    assert (m.kind, m.count, m.dim) == (kind, 400, 16)
    assert Manifest.read(tmp_path / kind) == m
    assert Manifest.read(tmp_path / kind).corpus == Manifest.read(src).corpus
    index = faiss.read_index(str(tmp_path / kind / "index.faiss"))
    assert index.ntotal == 400
    if kind == "ivfpq":
        faiss.extract_index_ivf(index).nprobe = 4
    _, ids = index.search(vecs[:50], 1)
    # HNSW finds each vector itself; IVF-PQ (4 bytes per vector) mostly does
    hits = float(np.mean(ids[:, 0] == np.arange(50)))
    assert hits == 1.0 if kind == "hnsw" else hits >= 0.5


def test_convert_refuses_non_flat_and_same_dir(tmp_path: Path):
    from searchr1.retriever.convert import convert_index, training_rows
    from searchr1.retriever.manifest import IndexMismatchError

    src, _ = _flat_dir(tmp_path)
    convert_index(src, tmp_path / "h", "hnsw")
    with pytest.raises(IndexMismatchError, match="only a flat one"):
        convert_index(tmp_path / "h", tmp_path / "h2", "ivfpq")
    with pytest.raises(ValueError, match="must differ"):
        convert_index(src, src, "hnsw")
    with pytest.raises(ValueError, match="convert to one of"):
        convert_index(src, tmp_path / "x", "flat")
    assert training_rows(10, 3).tolist() == [0, 4, 9]
    assert training_rows(3, 10).tolist() == [0, 1, 2]
