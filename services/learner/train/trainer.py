"""One training step over a `Batch`: the optimisation half of the learner (no Redis, no files).

`Trainer.train_step(batch, version)` takes the whole step's batch (identical on every rank), computes
outcome advantages on all of it (the one place they are computed: callers pass the batch as built),
keeps this rank's rows, runs the no-grad pre-pass (`prepass.py`), then for each mini-batch accumulates
gradients over micro-batches and applies one AdamW update (gradient clipping); the learning-rate schedule
steps once per training step. Each micro-batch reads forward → weights → loss → backward → figures
(`_policy_micro_step`).

Loss normalisation: each micro-batch's aggregated loss is scaled by its share of the *mini-batch's*
loss tokens across all ranks (or of its sequences, for the seq-mean aggregations) times the world size
(FSDP averages gradients over ranks), so the gradient equals that of one token-mean over the whole
mini-batch, whatever the micro-batching or the number of ranks. veRL 0.1 instead averages per
micro-batch and divides by the accumulation count, which weighs short micro-batches' tokens more.

Old log-probs: like veRL we need π_old for the ratio; when each step makes one update
(`mini_batches = 1`) π_old equals the current weights, so the forward's own log-probs (detached) are
used instead of a second forward pass — the same numbers, one forward less. Off-policy rows
(`policy_version < version`) get truncated importance weights exp(π_old − μ_behaviour) ≤ `is_cap`
multiplied into their advantages (decoupled PPO). PPO: critic values, in-reward KL and GAE are
computed in the pre-pass; advantages are whitened with the whole step's statistics (all-reduced).

KL loss (GRPO and PPO's actor): `kl_term.KLTerm` runs the policy's forward and the reference's per
micro-batch in the one KL shape the settings chose at start (none, a sampled estimator, or EMA-PG's full /
top-k KL; the pre-pass also records the pre-update policy's top-k ids for a reverse top-k KL). It is on
when `algorithm.kl_loss_on` (`use_kl_loss` with `kl_loss_coef > 0`). EMA anchor: with `ref_ema_tau < 1`
the reference moves towards the policy after every `ref_ema_period`-th step's last optimizer step
(`algo/reference.py`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor, nn

from searchr1.core.metrics import StageClock, in_stage
from searchr1.learner.algo.advantages import (
    OUTCOME_ESTIMATORS,
    outcome_advantages,
    ppo_advantages,
    ppo_token_rewards,
)
from searchr1.learner.algo.batch import Batch, shard_rows
from searchr1.learner.algo.losses import (
    POLICY_LOSSES,
    aggregate,
    truncated_importance_weights,
    value_loss,
)
from searchr1.learner.algo.mismatch import CorrectionParams, MismatchSums, correction_weights
from searchr1.learner.algo.reference import ema_due, ema_update_
from searchr1.learner.settings import LearnerSettings
from searchr1.learner.train.kl_term import KLTerm, MicroBatch, PolicyForward
from searchr1.learner.train.model import DistInfo, forward_values
from searchr1.learner.train.precision import precision
from searchr1.learner.train.prepass import PrePass, PrePassModels, run_prepass
from searchr1.learner.train.step_figures import (
    CriticFigures,
    PolicyFigures,
    PolicyTerms,
    RatioExtremes,
    StepStats,
    all_reduce,
    all_reduce_figures,
)


class Trainer:
    """Applies GRPO / PPO updates to the policy (and critic). Dependencies are passed in."""

    def __init__(
        self,
        settings: LearnerSettings,
        policy: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
        *,
        device: torch.device,
        info: DistInfo | None = None,
        reference: nn.Module | None = None,
        critic: nn.Module | None = None,
        critic_optimizer: torch.optim.Optimizer | None = None,
        critic_scheduler=None,
        stage_clock: StageClock | None = None,
    ) -> None:
        self.s = settings
        self.policy = policy
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.info = info or DistInfo()
        self.reference = reference
        self.critic = critic
        self.critic_optimizer = critic_optimizer
        self.critic_scheduler = critic_scheduler
        self.stage_clock = stage_clock
        """The learner's stage clock: each optimizer step (clip + step) runs in its `optimizer` stage."""
        self.nonfinite_skips = 0
        """Optimizer updates skipped because the gradient norm was NaN or infinite (every rank agrees:
        the norm is reduced over all of them)."""
        a = settings.algorithm
        self.is_ppo = a.advantage == "gae"
        if self.is_ppo and critic is None:
            raise ValueError("advantage 'gae' (PPO) needs a critic")
        if (a.kl_loss_on or a.kl_in_reward) and reference is None:
            raise ValueError("a KL term needs a reference model")
        self.policy_loss = POLICY_LOSSES[a.policy_loss]
        self.correction = CorrectionParams(a.tis_cap, a.seq_mask_band, a.icepop_band)
        self._correcting = a.mismatch_correction != "tis" or a.tis_cap is not None
        self.mismatch = MismatchSums()
        """The step's train–inference mismatch sums over its on-policy tokens (reset by `train_step`)."""
        prec = precision(settings.model.dtype, device)
        self.scaler = prec.grad_scaler(device)
        """The policy's dynamic loss scaler (`model.dtype` float16; `precision.py`), else None."""
        self.critic_scaler = prec.grad_scaler(device) if critic is not None else None
        """The critic's own loss scaler (its gradients have their own scale)."""
        # the KL loss's forwards and per-token values, in the shape chosen here (kl_term.py)
        self.kl_term = KLTerm(a, enabled=a.kl_loss_on)
        # per-step state, set by `_place` at the start of each `train_step`
        self._lengths: list[int] = []  # attention lengths of this rank's rows (micro-batch grouping)
        self._dummy: Batch | None = None  # one real row standing in for an empty micro-batch (_micro_rows)

    # ------------------------------------------------------------------ stages

    def train_step(self, batch: Batch, version: int) -> dict[str, float]:
        """Outcome advantages, the no-grad pre-pass (π_old, critic values, GAE), then each mini-batch's
        policy (and critic) update; the figures are averaged over the mini-batches."""
        b = self.s.batch
        batch = self._outcome_advantages(batch)
        local, bounds = self._place(batch)
        stale = local.policy_version < version
        self.mismatch = MismatchSums()
        pre = self._prepass(local)
        if self.is_ppo:
            local = self._gae(local, pre)
        stats, ratios = StepStats(), RatioExtremes()
        for m in range(b.mini_batches):
            rows = list(range(bounds[m], bounds[m + 1]))
            self._update_policy(local, rows, pre, stale, stats, ratios)
            if self.is_ppo:
                self._update_critic(local, rows, pre, stats)
        out = {k: v / b.mini_batches for k, v in stats.values.items()}
        out.update(ratios.figures(self.info, self.device))
        out.update(all_reduce_figures(self.mismatch, self.info, self.device).figures())
        out["lr"] = self.scheduler.get_last_lr()[0]  # the rate this step's updates used
        self.scheduler.step()
        if self.is_ppo:
            self.critic_scheduler.step()
        a = self.s.algorithm
        # EMA anchor: after the step's last optimizer step; the scheduler counts completed steps (restored
        # with it on resume). Under FSDP both models are sharded alike and each rank averages its shards.
        if self.reference is not None and ema_due(self.scheduler.last_epoch, a.ref_ema_tau, a.ref_ema_period):
            ema_update_(self.reference, self.policy, a.ref_ema_tau)
            out["ref_ema_update"] = 1.0
        return out

    def _outcome_advantages(self, batch: Batch) -> Batch:
        """Outcome advantages (GRPO, Dr. GRPO) over the whole step's groups; GAE waits for the critic."""
        a = self.s.algorithm
        if a.advantage in OUTCOME_ESTIMATORS:
            return outcome_advantages(batch, a.advantage, a.grpo_eps)
        return batch

    def _place(self, batch: Batch) -> tuple[Batch, list[int]]:
        """This rank's rows on the device and each mini-batch's bounds among them. Mini-batches are cut
        from the *global* batch, then sharded, so every optimizer update sees the same rows whatever the
        number of ranks."""
        b = self.s.batch
        cuts = [round(i * batch.size / b.mini_batches) for i in range(b.mini_batches + 1)]
        local_rows, bounds = [], [0]
        for m in range(b.mini_batches):
            size = cuts[m + 1] - cuts[m]
            local_rows += [cuts[m] + r for r in shard_rows(size, self.info.rank, self.info.world)]
            bounds.append(len(local_rows))
        local = batch.select(local_rows).to(self.device)
        self._lengths = local.attention_mask.sum(dim=1).tolist()
        self._dummy = batch.select([0]).to(self.device)
        return local, bounds

    def _prepass(self, local: Batch) -> PrePass:
        """The no-grad pre-pass (`prepass.py`): π_old when a step makes several updates or runs PPO, and
        PPO's reference log-probs (in-reward KL) and critic values. Empty otherwise."""
        a = self.s.algorithm
        need_old = self.s.batch.mini_batches > 1 or self.is_ppo
        if not need_old:
            return PrePass()
        models = PrePassModels(self.policy, self.kl_term, self.reference, self.critic, want_old=need_old,
                               want_ref=self.is_ppo and a.kl_in_reward, want_values=self.is_ppo)
        return run_prepass(models, local, self._micro_rows(list(range(local.size))), self._dummy, self.device)

    def _micro_rows(self, rows: list[int]) -> list[list[int]]:
        """`rows` in micro-batches of at most `micro_batch_size`, longest sequences first: rows of similar
        length share a micro-batch, so each is trimmed to little more than its own length (a mixed batch
        of rollouts pads to ~2x its tokens otherwise). The update does not depend on the grouping (loss
        normalisation above). Under FSDP every forward/backward is a collective, so every rank gets the
        same number of micro-batches (that of the rank with the most rows); a rank with fewer rows gets
        even splits, possibly an empty one (run on a dummy row with zero loss weight)."""
        lengths = self._lengths
        rows = sorted(rows, key=lambda r: -int(lengths[r]))
        longest = len(rows)
        if self.info.enabled:
            t = torch.tensor([longest], dtype=torch.long, device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            longest = int(t.item())
        n = max(1, math.ceil(longest / self.s.batch.micro_batch_size))
        bounds = [round(i * len(rows) / n) for i in range(n + 1)]
        return [rows[bounds[i]:bounds[i + 1]] for i in range(n)]

    def _gae(self, local: Batch, pre: PrePass) -> Batch:
        a = self.s.algorithm
        rewards = ppo_token_rewards(local, pre.old, pre.ref, a.kl_coef if a.kl_in_reward else 0.0, a.kl_penalty)
        moments = self._global_moments if self.info.enabled else None
        return ppo_advantages(local, rewards, pre.values, a.gamma, a.lam, moments)

    def _global_moments(self, raw: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and unbiased variance of `raw` over `mask` across all ranks (veRL whitens the whole
        batch on its driver; ranks here hold shards of it)."""
        m = mask.to(torch.float64)
        x = raw.to(torch.float64) * m
        s = torch.stack([m.sum(), x.sum(), (x * x).sum()])
        dist.all_reduce(s)
        n, total, sq = s.tolist()
        mean = total / max(n, 1.0)
        var = max(sq / max(n, 1.0) - mean * mean, 0.0) * n / max(n - 1.0, 1.0)
        return torch.tensor(mean, device=raw.device), torch.tensor(var, device=raw.device)

    def _norm_counts(self, mbs: list[Batch]) -> tuple[float, float]:
        tokens = sum(float(mb.loss_mask.sum()) for mb in mbs)
        seqs = sum(float((mb.loss_mask.sum(-1) > 0).sum()) for mb in mbs)
        tokens, seqs = all_reduce([tokens, seqs], self.info, self.device)
        return max(tokens, 1.0), max(seqs, 1.0)

    def _weight(self, mb: Batch, tokens: float, seqs: float) -> float:
        if self.s.algorithm.loss_agg == "token-mean":
            share = float(mb.loss_mask.sum()) / tokens
        else:
            share = float((mb.loss_mask.sum(-1) > 0).sum()) / seqs
        return share * self.info.world

    def _update_policy(self, local: Batch, rows: list[int], pre: PrePass, stale: Tensor,
                       stats: StepStats, ratios: RatioExtremes) -> None:
        """One optimizer update of the policy over mini-batch `rows`, gradients accumulated over its
        micro-batches."""
        mbs_rows = self._micro_rows(rows)
        mbs = [local.select(r) if r else self._dummy for r in mbs_rows]
        tokens, seqs = self._norm_counts([mb for r, mb in zip(mbs_rows, mbs) if r])
        self.optimizer.zero_grad(set_to_none=True)
        fig = PolicyFigures()
        for r, mb in zip(mbs_rows, mbs):
            self._policy_micro_step(mb, r, pre, stale, tokens, seqs, fig, ratios)
        grad_norm = self._optimizer_step(self.policy, self.optimizer)
        stats.add_all(all_reduce_figures(fig, self.info, self.device))
        stats.add("grad_norm", grad_norm)

    def _policy_micro_step(self, mb: Batch, r: list[int], pre: PrePass, stale: Tensor, tokens: float,
                           seqs: float, fig: PolicyFigures, ratios: RatioExtremes) -> None:
        """forward → weights → loss → backward → figures for one micro-batch (`r` empty: a dummy with zero
        loss weight that only keeps the ranks' FSDP collectives in step)."""
        mask = mb.loss_mask if r else torch.zeros_like(mb.loss_mask)
        share = pre.rows(r, mb.loss_mask.shape[1]) if r else PrePass()
        fwd = self._forward(mb, share)
        old = fwd.log_prob.detach() if share.old is None else share.old
        weights, adv = self._off_policy_weights(mb, r, stale, old, mask)
        terms = self._policy_terms(fwd, old, adv, mask)
        w = self._weight(mb, tokens, seqs) if mask.any() else 0.0
        scaled = terms.loss * w
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        fig.add(terms, weights, mask, w / self.info.world, tokens)
        ratios.add(fwd.log_prob, mb.behavior_logprobs, mask)

    def _forward(self, mb: Batch, pre: PrePass) -> PolicyForward:
        """The policy's forward with grad, and the KL term's per-token values (its shape chosen at start)."""
        return self.kl_term.forward(self.policy, self.reference, MicroBatch(
            mb.input_ids, mb.attention_mask, mb.response_mask, entropy=self.s.algorithm.entropy_coef != 0,
            old_log_prob=pre.old, topk_ids=pre.topk_ids))

    def _off_policy_weights(self, mb: Batch, r: list[int], stale: Tensor, old: Tensor,
                            mask: Tensor) -> tuple[Tensor, Tensor]:
        """Per-token truncated importance weights (1 on rows sampled with the current weights; with
        `algorithm.mismatch_correction`, those rows get the correction's weights against the engine's
        log-probs, and the step's mismatch sums count them) and the advantages they multiply."""
        adv = torch.zeros(mb.size, device=self.device) if not r or mb.advantages is None else mb.advantages
        weights = torch.ones_like(mask)
        if r and bool(stale[r].any()):
            w = truncated_importance_weights(old, mb.behavior_logprobs, mask, self.s.algorithm.is_cap)
            weights = torch.where(stale[r].unsqueeze(-1), w, weights)
            adv = (adv.unsqueeze(-1) if adv.dim() == 1 else adv) * weights
        if r:  # train–inference mismatch on the on-policy rows: the chosen correction (`algo/mismatch.py`)
            on = (~stale[r]).unsqueeze(-1)
            a = self.s.algorithm
            w = correction_weights(a.mismatch_correction, old, mb.behavior_logprobs, mask, self.correction)
            w = torch.where(on, w.to(weights.dtype), torch.ones_like(weights))
            self.mismatch.add(old, mb.behavior_logprobs, mask.bool() & on, w)
            if self._correcting:
                adv = (adv.unsqueeze(-1) if adv.dim() == 1 else adv) * w
                weights = weights * w
        return weights, adv

    def _policy_terms(self, fwd: PolicyForward, old: Tensor, adv: Tensor, mask: Tensor) -> PolicyTerms:
        """The policy-gradient loss, minus the entropy bonus, plus the KL loss."""
        a = self.s.algorithm
        pg = self.policy_loss(fwd.log_prob, old, adv, mask, a.clip_low, a.clip_high, a.loss_agg)
        loss = pg.loss
        ent_v = torch.zeros(())
        if fwd.entropy is not None:
            ent_v = aggregate(fwd.entropy, mask, a.loss_agg)
            loss = loss - a.entropy_coef * ent_v
        kl_v = torch.zeros(())
        if fwd.kl is not None:
            kl_v = aggregate(fwd.kl, mask, a.loss_agg)
            loss = loss + a.kl_loss_coef * kl_v
        return PolicyTerms(loss, pg, ent_v, kl_v)

    def _update_critic(self, local: Batch, rows: list[int], pre: PrePass, stats: StepStats) -> None:
        a = self.s.algorithm
        mbs_rows = self._micro_rows(rows)
        mbs = [local.select(r) if r else self._dummy for r in mbs_rows]
        # the critic learns on every response token (veRL's response mask), token-mean over the mini-batch
        own = sum(float(mb.response_mask.sum()) for r, mb in zip(mbs_rows, mbs) if r)
        tokens = max(all_reduce([own], self.info, self.device)[0], 1.0)
        self.critic_optimizer.zero_grad(set_to_none=True)
        fig = CriticFigures()
        for r, mb in zip(mbs_rows, mbs):
            width = mb.loss_mask.shape[1]
            v = forward_values(self.critic, mb.input_ids, mb.attention_mask)
            if not r:  # dummy micro-batch: zero-weight backward to keep FSDP collectives in step
                (v.sum() * 0.0).backward()
                continue
            vl = value_loss(v, mb.returns, pre.rows(r, width).values, mb.response_mask, a.value_clip)
            w = float(mb.response_mask.sum()) / tokens * self.info.world
            scaled = vl.loss * w
            (self.critic_scaler.scale(scaled) if self.critic_scaler is not None else scaled).backward()
            fig.value_loss += float(vl.loss.detach()) * w / self.info.world
            fig.value_clip_frac += float(vl.clip_frac) * w / self.info.world
        grad_norm = self._optimizer_step(self.critic, self.critic_optimizer)
        stats.add_all(all_reduce_figures(fig, self.info, self.device))
        stats.add("critic_grad_norm", grad_norm)

    @in_stage("optimizer", lambda self: self.stage_clock)
    def _optimizer_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
        """Clip `model`'s gradients and apply `optimizer`; returns the norm before clipping. A NaN or
        infinite norm skips the update (gradients dropped, optimizer state untouched) and is counted in
        `nonfinite_skips`: one poisoned batch does not turn every weight into NaN."""
        scaler = self.scaler if optimizer is self.optimizer else self.critic_scaler
        if scaler is not None:  # fp16: true gradients before clipping; an overflow lowers the scale
            scaler.unscale_(optimizer)
        grad_norm = self._clip(model)
        if not math.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)
            self.nonfinite_skips += 1
            if scaler is not None:
                scaler.update()
            return grad_norm
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        return grad_norm

    def _clip(self, model: nn.Module) -> float:
        params = [p for p in model.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, self.s.optim.grad_clip)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        value = float(norm)
        return value if math.isfinite(value) else float("nan")
