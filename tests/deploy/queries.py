"""The PromQL that Grafana and Prometheus would run, read from the files they load: every dashboard
panel's targets and every alert rule's expression. The deploy test runs them against the real
Prometheus once training has run; tests/unit/test_deploy_queries.py checks the extraction."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def dashboard_panels(path: Path, skip_rows: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """Panel title -> its targets' expressions, for every panel (rows' nested panels included), leaving
    out the panels of the rows titled in `skip_rows` (a row's panels follow it until the next row, or
    are nested in a collapsed one)."""
    out: dict[str, list[str]] = {}
    row = None
    for panel in json.loads(path.read_text()).get("panels", []):
        if panel.get("type") == "row":
            row = panel.get("title")
            nested = panel.get("panels", [])
        else:
            nested = [panel]
        if row in skip_rows:
            continue
        for p in nested:
            exprs = [t["expr"] for t in p.get("targets", []) if t.get("expr")]
            if exprs:
                out[p.get("title") or f"panel {p.get('id')}"] = exprs
    return out


def alert_expressions(path: Path) -> dict[str, str]:
    """Alert name -> expression, for every alerting rule of a Prometheus rules file."""
    groups = yaml.safe_load(path.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"] if "alert" in r}


def empty_panels(panels: dict[str, list[str]], series: dict[str, int]) -> list[str]:
    """Titles of panels none of whose expressions returned a series (`series`: expression -> count)."""
    return [title for title, exprs in panels.items() if not any(series.get(e, 0) for e in exprs)]
