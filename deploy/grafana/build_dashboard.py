"""Writes deploy/grafana/dashboards/searchr1.json (run after changing a panel; a test checks that every
metric a panel queries is defined by some service's metrics.py and that the JSON is up to date).

    python deploy/grafana/build_dashboard.py
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).parent / "dashboards" / "searchr1.json"

STACKED = {"Rollout wall time by stage (mean over workers)", "Learner wall time by stage"}
"""Panels drawn as stacked areas: stage clocks, whose stages add up to the wall time (100%)."""

ROWS: list[tuple[str, list[tuple[str, list[tuple[str, str]], str]]]] = [
    ("Learning", [
        ("Reward and EM", [("searchr1_learner_reward_mean", "reward"), ("searchr1_learner_em_mean", "EM"),
                           ("searchr1_rollout_reward_mean", "rollout reward")], "none"),
        ("Searches per trajectory", [("searchr1_learner_searches_per_trajectory", "searches")], "none"),
        ("KL and clip fraction", [("searchr1_learner_kl_loss", "KL"), ("searchr1_learner_clip_frac", "clip frac"),
                                  ("searchr1_learner_approx_kl", "approx KL")], "none"),
        ("Loss, entropy, grad norm", [("searchr1_learner_loss", "loss"), ("searchr1_learner_entropy", "entropy"),
                                      ("searchr1_learner_grad_norm", "grad norm")], "none"),
    ]),
    ("Health (collapse signals; the alerts use their 15 min means)", [
        ("Malformed, truncated, repeated queries", [
            ("searchr1_learner_malformed_rate", "malformed"), ("searchr1_learner_truncated_rate", "hit token limit"),
            ("searchr1_learner_repeated_query_rate", "repeated queries"),
            ("avg_over_time(searchr1_learner_malformed_rate[15m])", "malformed, 15 min mean")], "percentunit"),
        ("Answer and think length (words)", [("searchr1_learner_answer_words_mean", "answer"),
                                             ("searchr1_learner_think_words_mean", "think")], "none"),
        ("Searches per trajectory, 15 min mean",
         [("avg_over_time(searchr1_learner_searches_per_trajectory[15m])", "searches")], "none"),
        ("Non-finite figures, grad norm", [("searchr1_learner_nonfinite_figures", "NaN/inf figures"),
                                           ("searchr1_learner_grad_norm", "grad norm")], "none"),
    ]),
    ("Throughput", [
        ("Learner steps/min and tokens/s", [("rate(searchr1_learner_steps_total[5m]) * 60", "steps/min"),
                                            ("searchr1_learner_tokens_per_second", "train tokens/s")], "none"),
        ("Rollout tokens/s", [("sum(rate(searchr1_rollout_tokens_generated_total[1m]))", "generated"),
                              ("sum(rate(searchr1_rollout_env_tokens_total[1m]))", "environment")], "none"),
        ("Trajectories/s by finish reason",
         [("sum by (finish_reason) (rate(searchr1_rollout_trajectories_total[1m]))", "{{finish_reason}}")], "none"),
        ("Groups dropped (staleness …)",
         [("sum by (reason) (rate(searchr1_learner_groups_dropped_total[5m]))", "{{reason}}")], "none"),
    ]),
    ("Queues and weights", [
        ("Policy version", [("searchr1_learner_policy_version", "learner"),
                            ("searchr1_rollout_weight_version", "worker {{instance}}")], "none"),
        ("Task queue lag", [("searchr1_rollout_task_queue_lag", "{{instance}}"),
                            ("searchr1_rollout_inflight_tasks", "in flight {{instance}}")], "none"),
        ("Weight reload p99", [("histogram_quantile(0.99, sum by (le) (rate(searchr1_rollout_weight_reload_seconds_bucket[5m])))",
                                "p99")], "s"),
        ("Published values changed per version", [("searchr1_learner_published_changed_frac", "changed")],
         "percentunit"),
    ]),
    ("Where the time goes", [
        ("Rollout wall time by stage (mean over workers)",
         [("avg by (stage) (rate(searchr1_rollout_stage_seconds_total[1m]))", "{{stage}}")], "percentunit"),
        ("Learner wall time by stage",
         [("avg by (stage) (rate(searchr1_learner_stage_seconds_total[1m]))", "{{stage}}")], "percentunit"),
    ]),
    ("Retriever and reward", [
        ("Retriever requests/s", [("sum by (api, code) (rate(searchr1_retriever_requests_total[1m]))",
                                   "{{api}} {{code}}")], "reqps"),
        ("Retriever latency p50/p99", [
            ("histogram_quantile(0.5, sum by (le) (rate(searchr1_retriever_request_seconds_bucket[1m])))", "p50"),
            ("histogram_quantile(0.99, sum by (le) (rate(searchr1_retriever_request_seconds_bucket[1m])))", "p99"),
            ("histogram_quantile(0.99, sum by (le) (rate(searchr1_rollout_search_latency_seconds_bucket[1m])))",
             "rollout-side p99")], "s"),
        ("Retriever batch size and queue", [
            ("sum(rate(searchr1_retriever_batch_queries_sum[1m])) / sum(rate(searchr1_retriever_batch_queries_count[1m]))",
             "mean batch"), ("searchr1_retriever_queue_queries", "queued")], "none"),
        ("Reward items/s and p99", [
            ("sum by (scorer) (rate(searchr1_reward_items_total[1m]))", "{{scorer}} items/s"),
            ("histogram_quantile(0.99, sum by (le) (rate(searchr1_reward_request_duration_seconds_bucket[1m])))",
             "p99 s")], "none"),
    ]),
    ("Validation during training (searchr1 up)", [
        ("Held-out scores, greedy", [("searchr1_validation_score", "{{metric}}")], "percentunit"),
        ("Validated step and failed trajectories", [("searchr1_validation_step", "step"),
                                                    ("searchr1_validation_failed_trajectories", "failed")], "none"),
        ("Validations and their wall time", [("sum by (outcome) (searchr1_validation_runs_total)", "{{outcome}}"),
                                             ("searchr1_validation_duration_seconds", "last, s")], "none"),
    ]),
    ("Web search backend", [
        ("Web search queries/s and cache hit rate", [
            ("sum by (backend) (rate(searchr1_retriever_backend_queries_total[5m]))", "{{backend}} queries/s"),
            ("sum by (backend) (rate(searchr1_retriever_backend_cache_hits_total[5m])) / "
             "sum by (backend) (rate(searchr1_retriever_backend_queries_total[5m]))", "{{backend}} hit rate")], "none"),
        ("Web search API requests and errors/s", [
            ("sum by (backend, outcome) (rate(searchr1_retriever_backend_requests_total[5m]))",
             "{{backend}} {{outcome}}"),
            ("sum by (backend, reason) (rate(searchr1_retriever_backend_errors_total[5m]))",
             "{{backend}} error {{reason}}")], "reqps"),
        ("Web search budget used and spend", [
            ("max by (backend) (searchr1_retriever_backend_budget_used_ratio)", "{{backend}} budget used"),
            ("max by (backend) (searchr1_retriever_backend_spend)", "{{backend}} spent"),
            ("max by (backend) (searchr1_retriever_backend_billed_queries)", "{{backend}} billed queries")], "none"),
    ]),
]


def _stacked(title: str) -> dict:
    if title not in STACKED:
        return {}
    return {"min": 0, "max": 1, "custom": {"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 70,
                                           "lineWidth": 0}}


def build() -> dict:
    panels, y, pid = [], 0, 1
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "id": pid, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        pid += 1
        y += 1
        width = 24 // len(row)
        for i, (ptitle, targets, unit) in enumerate(row):
            panels.append({
                "type": "timeseries", "title": ptitle, "id": pid,
                "datasource": {"type": "prometheus", "uid": "prometheus"},
                "gridPos": {"h": 8, "w": width, "x": i * width, "y": y},
                "fieldConfig": {"defaults": {"unit": unit, **_stacked(ptitle)}, "overrides": []},
                "targets": [{"refId": chr(65 + j), "expr": expr, "legendFormat": legend,
                             "datasource": {"type": "prometheus", "uid": "prometheus"}}
                            for j, (expr, legend) in enumerate(targets)],
            })
            pid += 1
        y += 8
    return {"uid": "searchr1", "title": "searchr1", "schemaVersion": 39, "version": 1, "refresh": "10s",
            "time": {"from": "now-1h", "to": "now"}, "tags": ["searchr1"], "panels": panels,
            "templating": {"list": []}, "annotations": {"list": []}}


def render() -> str:
    return json.dumps(build(), indent=1) + "\n"


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(OUT)
