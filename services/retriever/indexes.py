"""Search indexes behind one interface: `Searcher.search(queries, k) -> Ranked` (rows and scores per
query, best first). Dense FAISS (Flat inner product, HNSW, IVF-PQ), sparse BM25 (bm25s), hybrid by
reciprocal-rank fusion, and an optional rerank hook over any of them.

Owns: creating/training/configuring FAISS indexes, BM25 indexing and retrieval, RRF (a pure function with
hand-checked tests) and the thread settings that matter on small CPUs. It does not read the corpus
(rows are FAISS row numbers = corpus rows) and knows nothing about the wire.

Departures from Search-R1:
- Search-R1's BM25 is pyserini/Lucene (Porter stemming); ours is bm25s (Lucene-style BM25 scoring,
  English stopwords, no stemmer), pure Python + numba, no JVM. Like pyserini it returns only documents
  that match at least one query term, so a BM25 query may get fewer than k hits.
- FAISS threads are pinned and `distance_compute_blas_threshold` lowered for batches of several queries
  (docs/architecture.md, "Platform notes"; `threads` decides per batch): batched Flat search then takes
  the BLAS path, several times cheaper with identical results, while a single query keeps FAISS's own
  loop, which is cheaper for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from searchr1.retriever.build_settings import FaissBuildSettings
from searchr1.retriever.settings import SearchSettings

if TYPE_CHECKING:
    from searchr1.retriever.corpus import Corpus
    from searchr1.retriever.encoders import Encoder

DenseKind = Literal["flat", "hnsw", "ivfpq"]
IndexKind = Literal["flat", "hnsw", "ivfpq", "bm25"]
DENSE_KINDS: tuple[str, ...] = ("flat", "hnsw", "ivfpq")


@dataclass(frozen=True, slots=True)
class Ranked:
    """Search results for a batch of queries: row -1 marks "no hit" (its score is -inf)."""

    rows: np.ndarray
    """int64 [n_queries, k] corpus rows, best first."""
    scores: np.ndarray
    """float32 [n_queries, k] scores (higher is better)."""

    def hits(self, i: int) -> list[tuple[int, float]]:
        """(row, score) pairs of query i, without the -1 padding."""
        return [(int(r), float(s)) for r, s in zip(self.rows[i], self.scores[i], strict=True) if r >= 0]


class Searcher(Protocol):
    """Anything that ranks corpus rows for text queries."""

    def search(self, queries: Sequence[str], k: int) -> Ranked: ...


# ---------------------------------------------------------------------------------------------- FAISS


@dataclass(frozen=True, slots=True)
class FaissParams:
    """Index-construction and search parameters of the dense kinds: a frozen view of the settings that
    declare them (construction: `[index.faiss]`, `build_settings.FaissBuildSettings`; search:
    `[retriever.search]`, `settings.SearchSettings`), whose fields hold the defaults and their meaning;
    built by `of`."""

    hnsw_m: int
    hnsw_ef_construction: int
    hnsw_ef_search: int
    """Raised to k when k is larger."""
    ivf_nlist: int
    ivf_nprobe: int
    pq_m: int
    pq_nbits: int

    @classmethod
    def of(cls, build: FaissBuildSettings | None = None, search: SearchSettings | None = None) -> FaissParams:
        """The construction parameters of `build` and the search parameters of `search` (None: that table's
        defaults)."""
        b, s = build or FaissBuildSettings(), search or SearchSettings()
        return cls(hnsw_m=b.hnsw_m, hnsw_ef_construction=b.hnsw_ef_construction, hnsw_ef_search=s.hnsw_ef_search,
                   ivf_nlist=b.ivf_nlist, ivf_nprobe=s.ivf_nprobe, pq_m=b.pq_m, pq_nbits=b.pq_nbits)

    @classmethod
    def for_build(cls, faiss: FaissBuildSettings) -> FaissParams:
        """The construction parameters of `faiss` (search parameters at their defaults)."""
        return cls.of(faiss)


def configure_faiss(threads: int, blas_threshold: int = 20) -> None:
    """Pin FAISS's OpenMP threads and lower the BLAS threshold (see module docstring)."""
    import faiss

    faiss.omp_set_num_threads(threads)
    faiss.cvar.distance_compute_blas_threshold = blas_threshold


def ivfpq_shape(dim: int, count: int, params: FaissParams) -> tuple[int, int, int]:
    """(nlist, m, nbits) for an IVF-PQ index over `count` vectors: FAISS's k-means wants ≥ 39 training
    points per centroid, so nlist ≤ count/39 and 2**nbits ≤ count/39 (training PQ8x8 on 400 points took
    30 s here, PQ8x3 under 1 s); m divides dim."""
    nlist = max(1, min(params.ivf_nlist, count // 39))
    nbits = max(1, min(params.pq_nbits, int(math.log2(max(count / 39, 2)))))
    m = params.pq_m or max(1, dim // 8)
    if dim % m:
        raise ValueError(f"pq_m={m} must divide the embedding dimension {dim}")
    return nlist, m, nbits


def new_faiss_index(kind: DenseKind, dim: int, count: int, params: FaissParams):
    """An empty inner-product FAISS index of `kind` (IVF-PQ still needs `train`)."""
    import faiss

    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params.hnsw_ef_construction
        return index
    if kind == "ivfpq":
        nlist, m, nbits = ivfpq_shape(dim, count, params)
        return faiss.index_factory(dim, f"IVF{nlist},PQ{m}x{nbits}", faiss.METRIC_INNER_PRODUCT)
    raise ValueError(f"unknown dense index kind {kind!r}; known: {DENSE_KINDS}")


def set_search_params(index, params: FaissParams, k: int = 0) -> None:
    """Apply the search-time parameters (efSearch / nprobe) to a loaded index."""
    import faiss

    if isinstance(index, faiss.IndexHNSW):
        index.hnsw.efSearch = max(params.hnsw_ef_search, k)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = min(params.ivf_nprobe, ivf.nlist)


class DenseSearcher:
    """Encode queries, then one FAISS search for the whole batch."""

    def __init__(self, encoder: Encoder, index, params: FaissParams | None = None) -> None:
        """`params`: the index's construction and search parameters (None: the settings' defaults)."""
        self.encoder = encoder
        self.index = index
        self.params = params = params or FaissParams.of()
        set_search_params(index, params)

    def search(self, queries: Sequence[str], k: int) -> Ranked:
        vectors = self.encoder.encode_queries(list(queries))
        return self.search_vectors(vectors, k)

    def search_vectors(self, vectors: np.ndarray, k: int) -> Ranked:
        """One FAISS search for a batch of query vectors."""
        import faiss

        if isinstance(self.index, faiss.IndexHNSW) and k > self.index.hnsw.efSearch:
            self.index.hnsw.efSearch = k
        scores, rows = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        rows = rows.astype(np.int64, copy=False)
        scores = np.where(rows >= 0, scores, -np.inf).astype(np.float32)
        return Ranked(rows, scores)


# ------------------------------------------------------------------------------------------------ BM25


BM25_STOPWORDS = "en"


def bm25_tokenize(texts: Iterable[str], *, as_ids: bool):
    """bm25s tokenisation (lower-case, English stopwords, no stemmer); one pass over `texts`, so a
    generator streams the corpus instead of holding its text."""
    import bm25s

    if isinstance(texts, str):
        texts = [texts]
    return bm25s.tokenize(texts, stopwords=BM25_STOPWORDS, return_ids=as_ids, show_progress=False)


def build_bm25(texts: Iterable[str], out_dir: str | Path, *, k1: float = 0.9, b: float = 0.4) -> None:
    """Index `texts` (row i = text i) with bm25s and save it (arrays + JSON, nothing pickled) in `out_dir`.
    k1/b default to pyserini's, which Search-R1's BM25 baseline used. The token ids of the whole corpus
    are held in memory while indexing (bm25s's design); the raw text is streamed."""
    import bm25s

    model = bm25s.BM25(k1=k1, b=b, method="lucene", backend="numba" if bm25s.NUMBA_AVAILABLE else "numpy")
    model.index(bm25_tokenize(texts, as_ids=True), show_progress=False)
    model.save(str(out_dir), show_progress=False)


class BM25Searcher:
    """bm25s retrieval (numba backend when available: its first search JIT-compiles for ~15 s, so the
    server warms it up before reporting ready); rows with score 0 (no term matched) are dropped."""

    def __init__(self, index_dir: str | Path, *, threads: int = 1, numba: bool | None = None) -> None:
        import bm25s

        self.model = bm25s.BM25.load(str(index_dir), mmap=True, show_progress=False)
        use_numba = bm25s.NUMBA_AVAILABLE if numba is None else numba
        self.model.backend = "numba" if use_numba else "numpy"
        self.threads = threads
        self.count = int(self.model.scores["num_docs"])

    def search(self, queries: Sequence[str], k: int) -> Ranked:
        n = len(queries)
        kk = min(k, self.count)
        rows = np.zeros((n, kk), dtype=np.int64)
        scores = np.zeros((n, kk), dtype=np.float32)
        tokens = bm25_tokenize(list(queries), as_ids=False)
        # a query with no tokens left (only stopwords/punctuation) has no hits; bm25s refuses such a query
        has = [i for i, t in enumerate(tokens) if t]
        if has:
            r, s = self.model.retrieve([tokens[i] for i in has], k=kk, show_progress=False, n_threads=self.threads,
                                       backend_selection="numba" if self.model.backend == "numba" else "auto")
            rows[has] = np.asarray(r, dtype=np.int64).reshape(len(has), kk)
            scores[has] = np.asarray(s, dtype=np.float32).reshape(len(has), kk)
        miss = scores <= 0
        rows = np.where(miss, -1, rows)
        scores = np.where(miss, -np.inf, scores).astype(np.float32)
        if kk < k:
            rows = np.pad(rows, ((0, 0), (0, k - kk)), constant_values=-1)
            scores = np.pad(scores, ((0, 0), (0, k - kk)), constant_values=-np.inf)
        return Ranked(rows, scores)


# ---------------------------------------------------------------------------------------------- hybrid


def rrf_fuse(rankings: Sequence[np.ndarray], k: int, rrf_k: float) -> Ranked:
    """Reciprocal-rank fusion: score(row) = Σ_lists 1 / (rrf_k + rank), rank starting at 1; -1 rows are
    ignored. Ties break by the smaller row id so results are deterministic. Returns the top k per query."""
    if not rankings:
        raise ValueError("rrf_fuse needs at least one ranking")
    n = rankings[0].shape[0]
    out_rows = np.full((n, k), -1, dtype=np.int64)
    out_scores = np.full((n, k), -np.inf, dtype=np.float32)
    for q in range(n):
        fused: dict[int, float] = {}
        for ranking in rankings:
            for rank, row in enumerate(ranking[q], start=1):
                if row >= 0:
                    fused[int(row)] = fused.get(int(row), 0.0) + 1.0 / (rrf_k + rank)
        best = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:k]
        for j, (row, score) in enumerate(best):
            out_rows[q, j] = row
            out_scores[q, j] = score
    return Ranked(out_rows, out_scores)


class HybridSearcher:
    """Fuse several searchers (e.g. dense + BM25) by RRF over their top `depth` lists."""

    def __init__(self, searchers: Sequence[Searcher], *, depth: int, rrf_k: float) -> None:
        """`depth` and `rrf_k`: the retriever's `search.hybrid_depth` and `search.rrf_k`."""
        if len(searchers) < 2:
            raise ValueError("a hybrid searcher needs at least two searchers")
        self.searchers = list(searchers)
        self.depth = depth
        self.rrf_k = rrf_k

    def search(self, queries: Sequence[str], k: int) -> Ranked:
        depth = max(k, self.depth)
        return rrf_fuse([s.search(queries, depth).rows for s in self.searchers], k, self.rrf_k)


# ---------------------------------------------------------------------------------------------- rerank

RerankFn = Callable[[str, Sequence[str]], Sequence[float]]
"""A reranker: (query, candidate passages' contents) -> one score per candidate, higher is better."""


class RerankingSearcher:
    """Take the inner searcher's top `depth` and reorder them by a reranker's scores."""

    def __init__(self, inner: Searcher, rerank: RerankFn, corpus: Corpus, *, depth: int = 20) -> None:
        self.inner = inner
        self.rerank = rerank
        self.corpus = corpus
        self.depth = depth

    def search(self, queries: Sequence[str], k: int) -> Ranked:
        first = self.inner.search(queries, max(k, self.depth))
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        for i, query in enumerate(queries):
            cand = [r for r, _ in first.hits(i)]
            if not cand:
                continue
            s = np.asarray(self.rerank(query, [self.corpus.get(r).contents for r in cand]), dtype=np.float32)
            order = np.argsort(-s, kind="stable")[:k]
            rows[i, : len(order)] = np.asarray(cand)[order]
            scores[i, : len(order)] = s[order]
        return Ranked(rows, scores)


def cross_encoder_reranker(model: str, *, device: str = "cpu", batch_size: int = 32) -> RerankFn:
    """A reranker from a sentence-transformers CrossEncoder at a local path."""
    from sentence_transformers import CrossEncoder

    ce = CrossEncoder(model, device=device)

    def rerank(query: str, passages: Sequence[str]) -> Sequence[float]:
        return ce.predict([(query, p) for p in passages], batch_size=batch_size, show_progress_bar=False).tolist()

    return rerank
