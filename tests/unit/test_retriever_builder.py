"""Index builder with a fake deterministic encoder: resumable chunks, manifest, Flat/HNSW/IVF-PQ agree
with brute force where they must, BM25 build, and the loader's refusals."""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from searchr1.retriever.builder import build_index
from searchr1.retriever.encoders import EncoderSpec
from searchr1.retriever.indexes import FaissParams, configure_faiss
from searchr1.retriever.loading import load_index
from searchr1.retriever.manifest import CHUNKS_DIR, IndexMismatchError, Manifest

DIM = 32
SPEC = EncoderSpec("fake-hash-encoder")


class HashEncoder:
    """Bag of hashed words → normalised DIM-vector; counts the passages it encodes."""

    name = "fake-hash-encoder"
    dim = DIM

    def __init__(self) -> None:
        self.encoded = 0

    def _vec(self, text: str) -> np.ndarray:
        v = np.zeros(DIM, dtype=np.float32)
        for w in text.lower().split():
            h = zlib.crc32(w.encode())
            v[h % DIM] += 1.0 + (h >> 8) % 7 / 7.0
        return v / max(np.linalg.norm(v), 1e-9)

    def encode_queries(self, texts):
        return np.stack([self._vec(t) for t in texts])

    def encode_passages(self, texts):
        self.encoded += len(texts)
        return np.stack([self._vec(t) for t in texts])


def write_corpus(path: Path, n: int) -> Path:
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(60)]
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"d{i}", "title": f"T{i}", "text": " ".join(rng.choice(words, 8))}) + "\n")
    return path


@pytest.fixture(autouse=True)
def _threads():
    configure_faiss(1)


def brute(enc: HashEncoder, corpus: Path, queries: list[str], k: int) -> np.ndarray:
    from searchr1.retriever.corpus import iter_passages

    p = enc.encode_queries([x.contents for _, x in iter_passages(corpus)])
    s = enc.encode_queries(queries) @ p.T
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def test_flat_build_resumes_missing_chunks(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 50)
    enc = HashEncoder()
    out = tmp_path / "idx"
    m = build_index(corpus, out, "flat", encoder=enc, encoder_spec=SPEC, chunk_size=8, keep_chunks=True)
    assert enc.encoded == 50 and m.count == 50 and m.dim == DIM and m.kind == "flat"
    assert sorted(p.name for p in (out / CHUNKS_DIR).iterdir()) == [f"{i:06d}.npy" for i in range(7)]
    # interrupt after chunk 3: chunks 3.. and the manifest are gone; a re-run encodes only those rows
    for i in range(3, 7):
        (out / CHUNKS_DIR / f"{i:06d}.npy").unlink()
    (out / "manifest.json").unlink()
    enc2 = HashEncoder()
    build_index(corpus, out, "flat", encoder=enc2, encoder_spec=SPEC, chunk_size=8, keep_chunks=False)
    assert enc2.encoded == 50 - 24
    assert not (out / CHUNKS_DIR).exists()
    # a different encoder spec invalidates the chunks instead of mixing embedding spaces
    build_index(corpus, tmp_path / "idx2", "flat", encoder=HashEncoder(), encoder_spec=SPEC, chunk_size=8,
                keep_chunks=True)
    enc3 = HashEncoder()
    build_index(corpus, tmp_path / "idx2", "flat", encoder=enc3, encoder_spec=EncoderSpec("other"), chunk_size=8,
                keep_chunks=False)
    assert enc3.encoded == 50
    queries = ["w1 w2 w3", "w40 w41", "w7"]
    loaded = load_index(out, encoder_factory=lambda spec: HashEncoder())
    try:
        got = loaded.searcher.search(queries, 5)
        np.testing.assert_array_equal(got.rows, brute(HashEncoder(), corpus, queries, 5))
        assert loaded.corpus.get(int(got.rows[0, 0])).doc_id == f"d{got.rows[0, 0]}"
        assert json.loads((out / "manifest.json").read_text())["corpus"]["sha256"]
    finally:
        loaded.corpus.close()


def test_hnsw_and_ivfpq(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 400)
    queries = [f"w{i} w{i + 1} w{i + 2}" for i in range(0, 40, 4)]
    want = brute(HashEncoder(), corpus, queries, 1)
    for kind in ("hnsw", "ivfpq"):
        out = tmp_path / kind
        m = build_index(corpus, out, kind, encoder=HashEncoder(), encoder_spec=SPEC,
                        params=replace(FaissParams.of(), hnsw_m=16, ivf_nlist=8, pq_m=8), chunk_size=100,
                        keep_chunks=False)
        assert m.kind == kind and m.count == 400
        loaded = load_index(out, encoder_factory=lambda spec: HashEncoder(),
                            search_params={"ivf_nprobe": 8, "hnsw_ef_search": 64})
        try:
            got = loaded.searcher.search(queries, 5)
            assert got.rows.shape == (len(queries), 5) and (got.rows >= 0).all()
            recall = np.mean([want[i, 0] in got.rows[i] for i in range(len(queries))])
            assert recall >= (0.9 if kind == "hnsw" else 0.5), (kind, recall)
        finally:
            loaded.corpus.close()


def test_bm25_build_and_manifest(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 30)
    m = build_index(corpus, tmp_path / "bm", "bm25")
    assert m.kind == "bm25" and m.encoder is None and m.count == 30
    assert Manifest.read(tmp_path / "bm") == m
    loaded = load_index(tmp_path / "bm", bm25_numba=False)  # numba's JIT costs ~15 s; integration uses it
    try:
        from searchr1.retriever.corpus import iter_passages

        text = next(p for _, p in iter_passages(corpus)).contents
        word = text.split("\n")[1].split()[0]
        got = loaded.searcher.search([word], 40)
        rows = [r for r, _ in got.hits(0)]
        with_word = [i for i, p in iter_passages(corpus) if word in p.contents.split("\n")[1].split()]
        assert sorted(rows) == with_word and got.rows.shape == (1, 40)
    finally:
        loaded.corpus.close()


def test_refusals(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 10)
    with pytest.raises(ValueError, match="needs an encoder"):
        build_index(corpus, tmp_path / "x", "flat")
    with pytest.raises(ValueError, match="unknown index kind"):
        build_index(corpus, tmp_path / "x", "annoy")  # type: ignore[arg-type]
    build_index(corpus, tmp_path / "idx", "flat", encoder=HashEncoder(), encoder_spec=SPEC, chunk_size=10_000,
                keep_chunks=False)
    (tmp_path / "c.jsonl").unlink()
    with pytest.raises(IndexMismatchError, match="not found"):
        load_index(tmp_path / "idx", encoder_factory=lambda spec: HashEncoder())
    write_corpus(tmp_path / "c.jsonl", 11)
    with pytest.raises(IndexMismatchError, match="bytes"):
        load_index(tmp_path / "idx", encoder_factory=lambda spec: HashEncoder())
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no rows"):
        build_index(tmp_path / "empty.jsonl", tmp_path / "e", "bm25")


def test_moved_index_finds_its_corpus(tmp_path):
    (tmp_path / "a").mkdir()
    corpus = write_corpus(tmp_path / "a" / "c.jsonl", 12)
    build_index(corpus, tmp_path / "a" / "idx", "bm25")
    assert json.loads((tmp_path / "a" / "idx" / "manifest.json").read_text())["corpus"]["path"] == "../c.jsonl"
    (tmp_path / "a").rename(tmp_path / "b")
    loaded = load_index(tmp_path / "b" / "idx", bm25_numba=False)
    try:
        assert loaded.manifest.corpus.path == str((tmp_path / "b" / "c.jsonl").resolve())
        assert loaded.corpus.get(11).doc_id == "d11"
    finally:
        loaded.corpus.close()


def test_old_absolute_manifest_and_corpus_override(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 12)
    build_index(corpus, tmp_path / "idx", "bm25")
    path = tmp_path / "idx" / "manifest.json"
    data = json.loads(path.read_text())
    data["corpus"]["path"] = str(corpus.resolve())  # as manifests stored it before paths were relative
    path.write_text(json.dumps(data))
    loaded = load_index(tmp_path / "idx", bm25_numba=False)
    loaded.corpus.close()
    corpus.rename(tmp_path / "elsewhere.jsonl")
    with pytest.raises(IndexMismatchError, match="not found.*--corpus"):
        load_index(tmp_path / "idx", bm25_numba=False)
    loaded = load_index(tmp_path / "idx", bm25_numba=False, corpus_path=tmp_path / "elsewhere.jsonl")
    try:
        assert loaded.corpus.get(0).doc_id == "d0"
    finally:
        loaded.corpus.close()


def test_import_existing_faiss_index(tmp_path):
    import faiss

    from searchr1.retriever.builder import import_faiss_index
    from searchr1.retriever.corpus import iter_passages

    corpus = write_corpus(tmp_path / "c.jsonl", 40)
    vectors = HashEncoder().encode_passages([p.contents for _, p in iter_passages(corpus)])
    flat = faiss.IndexFlatIP(DIM)
    flat.add(vectors)
    faiss.write_index(flat, str(tmp_path / "e5_Flat.index"))
    m = import_faiss_index(tmp_path / "e5_Flat.index", corpus, tmp_path / "imp", SPEC)
    assert (m.kind, m.count, m.dim) == ("flat", 40, DIM) and (tmp_path / "imp" / "index.faiss").is_symlink()
    loaded = load_index(tmp_path / "imp", encoder_factory=lambda spec: HashEncoder())
    try:
        queries = ["w3 w5", "w11"]
        np.testing.assert_array_equal(loaded.searcher.search(queries, 4).rows, brute(HashEncoder(), corpus, queries, 4))
    finally:
        loaded.corpus.close()
    hnsw = faiss.IndexHNSWFlat(DIM, 8, faiss.METRIC_INNER_PRODUCT)
    hnsw.add(vectors)
    faiss.write_index(hnsw, str(tmp_path / "h.index"))
    assert import_faiss_index(tmp_path / "h.index", corpus, tmp_path / "imp2", SPEC, link=False).kind == "hnsw"
    flat.add(vectors[:1])
    faiss.write_index(flat, str(tmp_path / "wrong.index"))
    with pytest.raises(IndexMismatchError, match="41 vectors but .* 40 rows"):
        import_faiss_index(tmp_path / "wrong.index", corpus, tmp_path / "imp3", SPEC)
    faiss.write_index(faiss.IndexLSH(DIM, 16), str(tmp_path / "lsh.index"))
    with pytest.raises(ValueError, match="unsupported FAISS index type"):
        import_faiss_index(tmp_path / "lsh.index", corpus, tmp_path / "imp4", SPEC)


def test_bm25_queries_without_tokens_get_no_hits(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 30)
    build_index(corpus, tmp_path / "bm", "bm25")
    loaded = load_index(tmp_path / "bm", bm25_numba=False)
    try:
        got = loaded.searcher.search(["the", "w3", "?!", ""], 3)
        assert got.hits(0) == [] and got.hits(2) == [] and got.hits(3) == []
        assert got.hits(1) and got.rows.shape == (4, 3)
    finally:
        loaded.corpus.close()
