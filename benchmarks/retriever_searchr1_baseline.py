"""Search-R1's dense retrieval server, reduced to the request path it runs, for benchmarks on a CPU.

Follows `search_r1/search/retrieval_server.py` of PeterGriffinJin/Search-R1 at commit
a14dc3a4ffc6fe88c1e95038d9738e21ba3f7a06: a FastAPI app with one *synchronous* `POST /retrieve` endpoint
(so FastAPI runs each request on its thread pool, and concurrent requests encode and search in parallel
threads), a pydantic `QueryRequest`, `DenseRetriever._batch_search` (per request: slices of
`retrieval_batch_size` = 512 queries, each one tokenizer call + one model forward + mean pooling + L2
normalisation + one `index.search`, then `corpus[int(idx)]` for every hit on a `datasets` JSON corpus,
with its tqdm bar on stderr), its response shape (`{"result": [[{"document": row, "score": s}]]}`), and
`uvicorn.run(app)` with uvicorn's defaults.

What differs, and why:
- CPU instead of `.cuda()`, and fp32: Search-R1's `__main__` sets `retrieval_use_fp16=True`, which is
  meant for a GPU (fp16 matrix products on a CPU are many times slower than fp32);
  `torch.cuda.empty_cache()` is a no-op without CUDA and is left out.
- Only the dense retriever (no BM25/pyserini), and the index and model paths, the encoder name, the host
  and the port come from flags; thread counts come from the environment (OMP_NUM_THREADS=1 is its best
  setting on a small CPU, and what the benchmark sets).
- The `datasets` cache goes to `--cache-dir`, so a benchmark run leaves nothing in the home directory.

    python benchmarks/retriever_searchr1_baseline.py --index_path IDX/index.faiss --corpus_path C.jsonl \\
        --retriever_model /path/to/minilm --retriever_name minilm --port 8001
"""

from __future__ import annotations

import argparse

import datasets
import faiss
import numpy as np
import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from tqdm import tqdm
from transformers import AutoModel, AutoTokenizer


def load_corpus(corpus_path: str, cache_dir: str | None):
    return datasets.load_dataset("json", data_files=corpus_path, split="train", num_proc=4, cache_dir=cache_dir)


def load_docs(corpus, doc_idxs):
    return [corpus[int(idx)] for idx in doc_idxs]


def pooling(pooler_output, last_hidden_state, attention_mask=None, pooling_method="mean"):
    if pooling_method == "mean":
        last_hidden = last_hidden_state.masked_fill(~attention_mask[..., None].bool(), 0.0)
        return last_hidden.sum(dim=1) / attention_mask.sum(dim=1)[..., None]
    if pooling_method == "cls":
        return last_hidden_state[:, 0]
    return pooler_output


class Encoder:
    def __init__(self, model_name: str, model_path: str, pooling_method: str, max_length: int) -> None:
        self.model_name = model_name
        self.pooling_method = pooling_method
        self.max_length = max_length
        self.model = AutoModel.from_pretrained(model_path)
        self.model.eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, use_fast=True)

    @torch.no_grad()
    def encode(self, query_list, is_query: bool = True) -> np.ndarray:
        if isinstance(query_list, str):
            query_list = [query_list]
        if "e5" in self.model_name.lower():
            query_list = [f"query: {q}" if is_query else f"passage: {q}" for q in query_list]
        if "bge" in self.model_name.lower() and is_query:
            query_list = [f"Represent this sentence for searching relevant passages: {q}" for q in query_list]
        inputs = self.tokenizer(query_list, max_length=self.max_length, padding=True, truncation=True,
                                return_tensors="pt")
        inputs = {k: v for k, v in inputs.items()}
        output = self.model(**inputs, return_dict=True)
        query_emb = pooling(output.pooler_output, output.last_hidden_state, inputs["attention_mask"],
                            self.pooling_method)
        if "dpr" not in self.model_name.lower():
            query_emb = torch.nn.functional.normalize(query_emb, dim=-1)
        query_emb = query_emb.detach().cpu().numpy()
        return query_emb.astype(np.float32, order="C")


class DenseRetriever:
    def __init__(self, args: argparse.Namespace) -> None:
        self.index = faiss.read_index(args.index_path)
        self.corpus = load_corpus(args.corpus_path, args.cache_dir)
        self.encoder = Encoder(args.retriever_name, args.retriever_model, "mean", 256)
        self.topk = args.topk
        self.batch_size = 512

    def batch_search(self, query_list, num=None, return_score=False):
        if isinstance(query_list, str):
            query_list = [query_list]
        if num is None:
            num = self.topk
        results, scores = [], []
        for start_idx in tqdm(range(0, len(query_list), self.batch_size), desc="Retrieval process: "):
            query_batch = query_list[start_idx : start_idx + self.batch_size]
            batch_emb = self.encoder.encode(query_batch)
            batch_scores, batch_idxs = self.index.search(batch_emb, k=num)
            batch_scores = batch_scores.tolist()
            batch_idxs = batch_idxs.tolist()
            flat_idxs = sum(batch_idxs, [])
            batch_results = load_docs(self.corpus, flat_idxs)
            batch_results = [batch_results[i * num : (i + 1) * num] for i in range(len(batch_idxs))]
            results.extend(batch_results)
            scores.extend(batch_scores)
        return results, scores


class QueryRequest(BaseModel):
    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def create_app(retriever: DenseRetriever, default_topk: int) -> FastAPI:
    app = FastAPI()

    @app.post("/retrieve")
    def retrieve_endpoint(request: QueryRequest):
        if not request.topk:
            request.topk = default_topk
        results, scores = retriever.batch_search(query_list=request.queries, num=request.topk,
                                                 return_score=request.return_scores)
        resp = []
        for i, single_result in enumerate(results):
            if request.return_scores:
                resp.append([{"document": doc, "score": score} for doc, score in zip(single_result, scores[i])])
            else:
                resp.append(single_result)
        return {"result": resp}

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index_path", required=True)
    p.add_argument("--corpus_path", required=True)
    p.add_argument("--retriever_model", required=True)
    p.add_argument("--retriever_name", default="minilm")
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--cache-dir", dest="cache_dir", default=None)
    args = p.parse_args()
    uvicorn.run(create_app(DenseRetriever(args), args.topk), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
