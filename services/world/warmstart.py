"""`searchr1 world warmstart`: the supervised pass that plays, for the tiny world, the role pre-training
plays for a real base model — it teaches the protocol's format, how to read an answer out of a
retrieved passage, and (by heart) the facts of the world's *known* entities. RL then starts from a
policy that can act, but imperfectly.

What it owns: trace sampling from fresh worlds, tokenisation with the loss mask, the training loop
(torch, deliberate thread count, rich progress), the saved model directory and its `warmstart.json`,
a greedy self-check (`self_check`) that measures format validity and EM with HF `generate`, and a
teacher-forced reading probe (`reading_check`): how much of a fact restated from the observation the
model predicts, on a world it never saw.

Facts it follows (from a probe on this box, issue 6): every `refresh_steps` a freshly generated world
supplies new unknown entities (same known ones), so memorising passages cannot work and the model must
copy from the observation; the final `<think>` restates the fact before `<answer>`; batches mix all trace
kinds and lengths (length-sorted batches made the search-or-answer choice swing globally).

Loss mask (the same invariant the RL trajectories obey): labels are the token ids on policy segments
and −100 on the prompt and on every environment token (observations). Each segment is tokenised on its
own, as in a rollout, where the observation ids are appended to the sampled ids.
"""

from __future__ import annotations

import json
import math
import random
import re
import string
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchr1.core.protocol import observation_for, parse_action, render_prompt
from searchr1.world.generator import Entity, Question, World, generate_world
from searchr1.world.settings import GeneratorSettings, ModelSettings, WarmstartSettings
from searchr1.world.traces import Trace, TraceRates, make_trace

IGNORE = -100


# --- tokenisation with the loss mask -------------------------------------------------------------------
def encode_trace(tokenizer, trace: Trace) -> tuple[list[int], list[int]]:
    """(input_ids, labels): the rendered prompt then each segment tokenised separately; labels copy the
    ids on policy segments and are −100 on the prompt and on environment segments."""
    prompt = render_prompt(trace.question, tokenizer)
    ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    labels = [IGNORE] * len(ids)
    for seg in trace.segments:
        seg_ids = list(tokenizer(seg.text, add_special_tokens=False)["input_ids"])
        ids.extend(seg_ids)
        labels.extend(seg_ids if seg.policy else [IGNORE] * len(seg_ids))
    return ids, labels


def collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int):
    """Right-padded tensors (input_ids, attention_mask, labels); padding is masked and ignored."""
    import torch

    n = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), n), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(examples), n), dtype=torch.long)
    for i, (ids, lab) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        labels[i, : len(lab)] = torch.tensor(lab)
        attention[i, : len(ids)] = 1
    return input_ids, attention, labels


def lr_at(step: int, ws: WarmstartSettings) -> float:
    """Linear warm-up to `lr`, then cosine decay to `lr * min_lr_ratio` at the last step."""
    if ws.warmup_steps and step < ws.warmup_steps:
        return ws.lr * (step + 1) / ws.warmup_steps
    span = max(1, ws.steps - ws.warmup_steps)
    t = min(1.0, (step - ws.warmup_steps) / span)
    return ws.lr * (ws.min_lr_ratio + (1 - ws.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


# --- trace sampling from fresh worlds ------------------------------------------------------------------
@dataclass
class TraceSampler:
    """Samples mixed traces; a fresh world (new unknown entities, the target's known ones) every
    `refresh_steps` steps. Deterministic for a given seed."""

    generator: GeneratorSettings
    known: list[Entity]
    reserved_names: list[str]
    ws: WarmstartSettings
    rng: random.Random = field(init=False)
    epoch: int = field(default=-1, init=False)
    kinds: Counter = field(default_factory=Counter, init=False)

    def __post_init__(self) -> None:
        from searchr1.world.search import CorpusSearch

        self._CorpusSearch = CorpusSearch
        self.rng = random.Random(f"warmstart-{self.ws.seed}")
        self.rates = TraceRates(self.ws.p_guess, self.ws.p_needless_search, self.ws.p_noisy_query,
                                self.ws.p_wrong_copy, self.ws.topk)

    def _refresh(self, epoch: int) -> None:
        # seeds far from any world a user builds by hand; names of the target world are reserved
        seed = 1_000_000_007 + 7919 * self.ws.seed + epoch
        self.world = generate_world(self.generator, seed, known=self.known, reserved_names=self.reserved_names)
        self.search = self._CorpusSearch(self.world.corpus_cache()).search
        pools: dict[tuple[bool, int], list[Question]] = {}
        for q in self.world.questions():
            pools.setdefault((q.known, len(q.hops)), []).append(q)
        self.pools = pools
        self.epoch = epoch

    def batch(self, step: int, size: int) -> list[Trace]:
        epoch = step // self.ws.refresh_steps
        if epoch != self.epoch:
            self._refresh(epoch)
        out = []
        for _ in range(size):
            known = self.rng.random() < self.ws.known_fraction
            hops = 2 if self.rng.random() < self.ws.two_hop_fraction else 1
            pool = self.pools.get((known, hops)) or self.pools[(known, 1)]
            trace = make_trace(self.world, self.rng.choice(pool), self.search, self.rates, self.rng)
            self.kinds[trace.kind] += 1
            out.append(trace)
        return out


# --- copy pre-training -----------------------------------------------------------------------------------
def copy_example(rng: random.Random, vocab_size: int, first_id: int = 3) -> tuple[list[int], list[int]]:
    """One copy drill: random tokens `prefix + seq + filler + seq` (prefix and filler 0–30 tokens, seq 8–40,
    ids in [first_id, vocab_size)); labels train only the second `seq` after its first token (the part
    predictable by looking back at the first occurrence). The lengths vary, so no fixed look-back
    distance solves it: only content-based copying (induction) does."""
    def draw(n: int) -> list[int]:
        return [rng.randrange(first_id, vocab_size) for _ in range(n)]

    prefix, seq, filler = draw(rng.randint(0, 30)), draw(rng.randint(8, 40)), draw(rng.randint(0, 30))
    ids = prefix + seq + filler + seq
    labels = [IGNORE] * (len(ids) - len(seq) + 1) + seq[1:]
    return ids, labels


@dataclass
class CopyResult:
    steps: int
    losses: list[tuple[int, float]]
    accuracy: float
    seconds: float


def copy_pretrain(model, ws: WarmstartSettings, vocab_size: int, pad_id: int, *,
                  on_log: Callable[[int, float, float], None] | None = None) -> CopyResult:
    """`ws.copy_steps` AdamW steps (constant lr `ws.lr`) on copy drills (`copy_example`): the part of
    pre-training that teaches a small model to copy what it has read. A 0.74M model on this box learns
    the format from traces in a few hundred steps but not to copy a fact out of a passage; on drills it
    shows a sharp transition (copy accuracy ~1% → 99% around step 2,000), after which reading can be
    learned from the traces. `on_log(step, mean loss, accuracy)` every `log_every` steps; the returned
    accuracy is over the last logged window (greedy, labelled tokens)."""
    import torch
    import torch.nn.functional as F

    rng = random.Random(f"copy-{ws.seed}")
    torch.manual_seed(ws.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=ws.weight_decay, betas=(0.9, 0.95))
    losses: list[tuple[int, float]] = []
    window: list[float] = []
    right = total = 0
    acc = 0.0
    t0 = time.perf_counter()
    for step in range(ws.copy_steps):
        input_ids, attention, labels = collate([copy_example(rng, vocab_size) for _ in range(ws.copy_batch_size)],
                                               pad_id)
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
        target = labels[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), ws.grad_clip)
        opt.step()
        mask = target != IGNORE
        right += int((logits.argmax(-1)[mask] == target[mask]).sum())
        total += int(mask.sum())
        window.append(float(loss.detach()))
        if (step + 1) % ws.log_every == 0 or step + 1 == ws.copy_steps:
            mean, acc = sum(window) / len(window), right / max(1, total)
            losses.append((step + 1, round(mean, 5)))
            window.clear()
            right = total = 0
            if on_log:
                on_log(step + 1, mean, acc)
    model.eval()
    return CopyResult(ws.copy_steps, losses, round(acc, 4), time.perf_counter() - t0)


# --- training ------------------------------------------------------------------------------------------
@dataclass
class WarmstartResult:
    steps: int
    losses: list[tuple[int, float]]
    seconds: float
    kinds: dict[str, int]


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices of one step's examples grouped into micro-batches of similar length (sorted), each with at
    most `max_tokens` padded tokens (and at least one example). The optimiser still steps once on the
    whole mixed batch; grouping only removes padding work."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        if cur and lengths[i] * (len(cur) + 1) > max_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    return groups


def step_loss_backward(model, examples: Sequence[tuple[list[int], list[int]]], pad_id: int,
                       max_tokens: int) -> tuple[float, int]:
    """Token-mean cross-entropy over every labelled token of the step, accumulated over length-grouped
    micro-batches (sum per micro-batch / total labelled tokens, so the gradient equals one big padded
    batch's). Calls backward; returns (loss, labelled tokens)."""
    import torch.nn.functional as F

    total = sum(sum(1 for x in lab[1:] if x != IGNORE) for _, lab in examples)
    if total == 0:
        return 0.0, 0
    loss_sum = 0.0
    for group in micro_batches([len(ids) for ids, _ in examples], max_tokens):
        input_ids, attention, labels = collate([examples[i] for i in group], pad_id)
        logits = model(input_ids=input_ids, attention_mask=attention).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                               labels[:, 1:].reshape(-1), ignore_index=IGNORE, reduction="sum")
        (loss / total).backward()
        loss_sum += float(loss.detach())
    return loss_sum / total, total


def train(model, tokenizer, sampler: TraceSampler, ws: WarmstartSettings, *,
          on_log: Callable[[int, float, float], None] | None = None,
          on_step: Callable[[int], None] | None = None) -> WarmstartResult:
    """Run `ws.steps` AdamW steps on sampled traces; returns the logged mean losses. `on_log(step, mean
    loss, lr)` runs every `log_every` steps, `on_step(step)` after every step."""
    import torch

    torch.manual_seed(ws.seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=ws.weight_decay, betas=(0.9, 0.95))
    losses: list[tuple[int, float]] = []
    window: list[float] = []
    t0 = time.perf_counter()
    for step in range(ws.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, ws)
        examples = [encode_trace(tokenizer, t) for t in sampler.batch(step, ws.batch_size)]
        opt.zero_grad(set_to_none=True)
        loss, _ = step_loss_backward(model, examples, tokenizer.pad_token_id, ws.micro_batch_tokens)
        torch.nn.utils.clip_grad_norm_(model.parameters(), ws.grad_clip)
        opt.step()
        window.append(loss)
        if on_step:
            on_step(step + 1)
        if (step + 1) % ws.log_every == 0 or step + 1 == ws.steps:
            mean = sum(window) / len(window)
            losses.append((step + 1, round(mean, 5)))
            window.clear()
            if on_log:
                on_log(step + 1, mean, lr_at(step, ws))
    model.eval()
    return WarmstartResult(ws.steps, losses, time.perf_counter() - t0, dict(sorted(sampler.kinds.items())))


# --- greedy self-check ---------------------------------------------------------------------------------
def normalize_answer(s: str) -> str:
    """SQuAD-style normalisation (lower-case, no punctuation, no articles, single spaces), as Search-R1."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


_WELL_FORMED = re.compile(
    r"^\s*<think>[^<]*</think>\s*"
    r"(?:<search>[^<]*</search>\s*<information>.*?</information>\s*<think>[^<]*</think>\s*)*"
    r"<answer>[^<]*</answer>\s*(?:<\|im_end\|>)?\s*$",
    re.DOTALL,
)


def is_well_formed(response: str) -> bool:
    """think → (search → information → think)* → answer, with only whitespace between the tags."""
    return _WELL_FORMED.match(response) is not None


def extract_answer(response: str) -> str | None:
    found = re.findall(r"<answer>(.*?)</answer>", response, re.DOTALL)
    return found[-1].strip() if found else None


def self_check(model, tokenizer, world: World, questions: Sequence[dict[str, Any]], *,
               observation: str = "gold", max_searches: int = 3, max_turn_tokens: int = 64,
               topk: int = 3) -> dict[str, Any]:
    """Greedy multi-turn generation with HF `generate` on `questions` (world.json question records).
    Each search is answered with BM25 hits over the world's corpus; with `observation="gold"` the
    passage of the current hop is put first when BM25 missed it (so the check measures reading and
    format, not query quality). Returns EM, format-valid rate, searches per question, per data_source,
    and a few sample responses."""
    import torch

    from searchr1.world.search import CorpusSearch

    search = CorpusSearch(world.corpus_cache())
    stop_ids = [tokenizer.eos_token_id] + [tokenizer.convert_tokens_to_ids(t) for t in ("</search>", "</answer>")]
    rows = []
    model.eval()
    for rec in questions:
        prompt = render_prompt(rec["question"], tokenizer)
        ctx = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        response, searches = "", 0
        for _ in range(max_searches + 1):
            with torch.no_grad():
                out = model.generate(ctx, attention_mask=torch.ones_like(ctx), max_new_tokens=max_turn_tokens,
                                     do_sample=False, eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id)
            new = out[0, ctx.shape[1]:]
            text = tokenizer.decode(new, skip_special_tokens=False)
            response += text
            ctx = out
            action = parse_action(text)
            if action.kind != "search" or searches >= max_searches:
                break
            hits = search.search(action.content, topk)
            if observation == "gold":
                gold = rec["gold_doc_ids"][min(searches, len(rec["gold_doc_ids"]) - 1)]
                if gold not in hits:
                    hits = [gold] + hits[: topk - 1]
            searches += 1
            obs = observation_for(search.contents(hits))
            response += obs
            obs_ids = tokenizer(obs, add_special_tokens=False)["input_ids"]
            ctx = torch.cat([ctx, torch.tensor([obs_ids])], dim=1)
        answer = extract_answer(response)
        em = answer is not None and normalize_answer(answer) in {normalize_answer(a) for a in rec["answers"]}
        rows.append({"data_source": rec.get("data_source", "world"), "em": float(em),
                     "valid": float(is_well_formed(response)), "searches": searches, "response": response})
    return summarize(rows)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def agg(rs: list[dict[str, Any]]) -> dict[str, float]:
        n = max(1, len(rs))
        return {"n": len(rs), "em": round(sum(r["em"] for r in rs) / n, 4),
                "format_valid": round(sum(r["valid"] for r in rs) / n, 4),
                "searches_per_question": round(sum(r["searches"] for r in rs) / n, 3)}

    by_source: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_source.setdefault(r["data_source"], []).append(r)
    return {**agg(rows), "by_data_source": {k: agg(v) for k, v in sorted(by_source.items())},
            "samples": [r["response"] for r in rows[:3]]}


# --- reading probe (teacher-forced) --------------------------------------------------------------------
READING_SEED = 3_000_000_019
"""Seed of the world the reading probe uses (never a warm-start or tokenizer world)."""


def value_token_positions(tokenizer, text: str, value: str) -> list[int]:
    """Indices of the tokens of `text` that overlap the last occurrence of `value` before `</think>`
    (the value restated in the final think)."""
    end = text.rindex("</think>")
    start = text.rindex(value, 0, end)
    stop = start + len(value)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < stop and b > start]


def reading_check(model, tokenizer, world: World, n: int = 64, topk: int = 3, seed: int = 0) -> dict[str, Any]:
    """How well the model *reads*: on `n` clean search traces about unknown entities of `world` (a world
    the model never trained on), the share of the restated value's tokens (the fact copied out of the
    observation in the final think) that the model predicts greedily with the trace as context
    (teacher forcing), and the share of values it gets entirely right. One forward pass per trace: a
    cheap, direct measure of the skill search depends on (EM also needs the query and the answer)."""
    import torch

    from searchr1.world.search import CorpusSearch

    search = CorpusSearch(world.corpus_cache()).search
    rates = TraceRates(p_guess=0.0, p_needless_search=0.0, p_noisy_query=0.0, p_wrong_copy=0.0, topk=topk)
    rng = random.Random(f"reading-{seed}")
    pool = world.questions(known=False)
    right = total = whole = 0
    model.eval()
    for q in rng.sample(pool, min(n, len(pool))):
        trace = make_trace(world, q, search, rates, rng)
        ids, _ = encode_trace(tokenizer, trace)
        final = trace.segments[-1].text
        offset = len(ids) - len(tokenizer(final, add_special_tokens=False)["input_ids"])
        positions = [offset + i for i in value_token_positions(tokenizer, final, trace.answer)]
        with torch.no_grad():
            pred = model(torch.tensor([ids])).logits[0].argmax(-1)
        ok = [int(pred[p - 1]) == ids[p] for p in positions]
        right += sum(ok)
        total += len(ok)
        whole += all(ok)
    k = min(n, len(pool))
    return {"traces": k, "value_token_accuracy": round(right / max(1, total), 4),
            "value_exact": round(whole / max(1, k), 4), "topk": topk}


def reading_world(generator: GeneratorSettings, target: World) -> World:
    """The probe's world: the target's known entities, fresh unknown ones (target names reserved)."""
    return generate_world(generator, READING_SEED, known=target.known_entities(),
                          reserved_names=[e.name for e in target.entities if not e.known])


# --- the command's body ---------------------------------------------------------------------------------
def run_warmstart(world_dir: str | Path, out: str | Path, ws: WarmstartSettings, *,
                  model_settings: ModelSettings | None = None, show_progress: bool = True,
                  init: str | Path | None = None) -> dict[str, Any]:
    """Warm-start a fresh model (or continue the one in `init`) for the world in `world_dir`; save it
    (with tokenizer) into `out` and write `out/warmstart.json`. Returns that report."""
    import torch

    from searchr1.core.weights import snapshot_digest
    from searchr1.world.build import load_world
    from searchr1.world.model import count_parameters, init_model, save_model
    from searchr1.world.tokenizer import load_tokenizer

    torch.set_num_threads(ws.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass
    world_dir, out = Path(world_dir), Path(out)
    world, doc = load_world(world_dir)
    gen = GeneratorSettings.model_validate(doc["settings"]["generator"])
    ms = model_settings or ModelSettings.model_validate(doc["settings"]["model"])
    tokenizer = load_tokenizer(world_dir / "tokenizer")
    if init is None:
        model = init_model(ms, tokenizer)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(init), dtype=torch.float32)
    sampler = TraceSampler(gen, world.known_entities(), [e.name for e in world.entities if not e.known], ws)
    probe_world = reading_world(gen, world)

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    console.print(f"[bold]warm start[/]: {count_parameters(model):,} parameters, {ws.steps} steps × "
                  f"{ws.batch_size} traces, lr {ws.lr}, {ws.threads} torch threads, world {world_dir}")
    progress = Progress(TextColumn("warm start"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=not show_progress)
    with progress:
        task = progress.add_task("train", total=ws.steps, info="")

        def on_log(step: int, loss: float, lr: float) -> None:
            progress.update(task, info=f"loss {loss:.3f} lr {lr:.2e}")
            live = show_progress and console.is_terminal
            if not live and (step % (ws.log_every * 10) == 0 or step == ws.steps):
                console.print(f"step {step}/{ws.steps} loss {loss:.4f} lr {lr:.2e}")

        curve: list[dict[str, Any]] = []
        test = doc["questions"]["test"][: ws.eval_questions]

        def on_step(step: int) -> None:
            progress.update(task, completed=step)
            if ws.eval_every and test and step % ws.eval_every == 0 and step < ws.steps:
                check = self_check(model, tokenizer, world, test[:32], observation="gold", topk=ws.topk)
                reading = reading_check(model, tokenizer, probe_world, 32, ws.topk)
                model.train()
                curve.append({"step": step, "em": check["em"], "format_valid": check["format_valid"],
                              "searches_per_question": check["searches_per_question"],
                              "value_token_accuracy": reading["value_token_accuracy"]})
                progress.console.print(f"step {step}: self-check EM {check['em']:.3f}, format-valid "
                                       f"{check['format_valid']:.3f}, searches/question "
                                       f"{check['searches_per_question']:.2f}, reading (value tokens) "
                                       f"{reading['value_token_accuracy']:.3f}")

        copied: CopyResult | None = None
        if init is None and ws.copy_steps:
            ctask = progress.add_task("copy", total=ws.copy_steps, info="")

            def on_copy(step: int, loss: float, acc: float) -> None:
                progress.update(ctask, completed=step, info=f"copy loss {loss:.3f} accuracy {acc:.3f}")
                if not (show_progress and console.is_terminal) and (step % (ws.log_every * 25) == 0
                                                                     or step == ws.copy_steps):
                    console.print(f"copy step {step}/{ws.copy_steps} loss {loss:.4f} accuracy {acc:.3f}")

            copied = copy_pretrain(model, ws, len(tokenizer), tokenizer.pad_token_id, on_log=on_copy)
        result = train(model, tokenizer, sampler, ws, on_log=on_log, on_step=on_step)

    save_model(model, tokenizer, out)
    report_path = out / "warmstart.json"
    report_path.unlink(missing_ok=True)
    digest = snapshot_digest(out)
    check: dict[str, Any] | None = None
    if test:
        t0 = time.perf_counter()
        check = self_check(model, tokenizer, world, test, observation="gold", topk=ws.topk)
        check["seconds"] = round(time.perf_counter() - t0, 1)
        console.print(f"self-check (greedy, gold passage supplied, {check['n']} test questions): "
                      f"EM {check['em']:.3f}, format-valid {check['format_valid']:.3f}, "
                      f"searches/question {check['searches_per_question']:.2f}")
    reading = reading_check(model, tokenizer, probe_world, 64, ws.topk)
    console.print(f"reading (teacher-forced, {reading['traces']} unseen traces): value tokens "
                  f"{reading['value_token_accuracy']:.3f}, whole values {reading['value_exact']:.3f}")
    report = {
        "format": 1,
        "world": str(world_dir),
        "world_seed": doc["seed"],
        "seed": ws.seed,
        "init": str(init) if init is not None else None,
        "steps": result.steps,
        "batch_size": ws.batch_size,
        "threads": ws.threads,
        "parameters": count_parameters(model),
        "seconds": round(result.seconds, 1),
        "first_loss": result.losses[0][1] if result.losses else None,
        "final_loss": result.losses[-1][1] if result.losses else None,
        "losses": result.losses,
        "trace_kinds": result.kinds,
        "settings": ws.model_dump(mode="json"),
        "model": ms.model_dump(mode="json"),
        "sha256": digest,
        "sha256_note": "searchr1.core.weights.snapshot_digest of the directory before warmstart.json was written",
        "copy_pretraining": None if copied is None else {
            "steps": copied.steps, "batch_size": ws.copy_batch_size, "final_accuracy": copied.accuracy,
            "seconds": round(copied.seconds, 1), "losses": copied.losses},
        "self_check": check,
        "reading": reading,
        "self_check_curve": curve,
    }
    report_path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    console.print(f"saved {out} (sha256 {digest[:16]}…) in {result.seconds / 60:.1f} min; "
                  f"loss {report['first_loss']} → {report['final_loss']}")
    return report
