"""No compose command the docs name can start two learners (two would fight for the run's lease, the loser
exiting and restarting under `on-failure`).

Every `docker compose … up …` / `docker-compose … up …` written in README.md, docs/, the compose files,
Dockerfile.cuda, .env.example and the compose generator (`searchr1.deploy.compose`) is parsed (its `-f` files, `--profile`s, `--scale`s and
service names), rendered by Debian's docker-compose v1 (`config`, the merge a user's `up` performs; the
generated docker-compose.gpu.yml is made from configs/searchr1-3b-grpo.toml, its top-level `name:` left out
as `--compose-v1` does, which v1 needs), and the services that `up`
would start are counted: exactly one runs `searchr1 train` (not `--check`), or none where the command
starts a few named services without the learner. No compose file declares a profile, so no `--profile`
or COMPOSE_PROFILES can add a second learner to what the files name either.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from searchr1.deploy import compose as compose_gpu
from searchr1.deploy.plan import deploy_plan
from tests.unit.test_deploy_compose import SECRETS, _tool

ROOT = Path(__file__).resolve().parents[2]

SOURCES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")), "docker-compose.yml",
           "docker-compose.tiny-gpu.yml", "Dockerfile.cuda", ".env.example", "services/deploy/compose.py"]
COMPOSE = re.compile(r"docker[ -]compose(?=\s)")
OPTION_ARGS = {"-f", "--file", "--profile", "-p", "--project-name", "--project-directory", "--env-file"}


def _snippets(path: Path) -> list[str]:
    """Where a command can be: inline code (which may wrap lines) and code or comment lines."""
    text = path.read_text()
    inline = re.sub(r"```.*?```", "", text, flags=re.S)
    out = [" ".join(m.split()) for m in re.findall(r"`([^`]+)`", inline)] if path.suffix == ".md" else []
    for line in text.splitlines():
        line = line.strip().lstrip("#").strip()
        out.append(line.split("  #")[0])
    return out


def documented_up_commands() -> list[tuple[str, list[str]]]:
    """(where, words after `docker compose`) of every documented `up`."""
    found = []
    for name in SOURCES:
        for snippet in _snippets(ROOT / name):
            for m in COMPOSE.finditer(snippet):
                words = []
                for w in snippet[m.end():].split():
                    if w in ("&&", ";", "|", ">") or w.startswith(("(", "`")):
                        break
                    if "`" in w:  # the end of an inline code span
                        words.append(w.split("`")[0])
                        break
                    words.append(w)
                if "up" in words:
                    found.append((name, words))
    return found


def _parse(words: list[str]) -> tuple[list[str], list[str], dict[str, int], list[str]]:
    """(files, profiles, scales, services) of `docker compose WORDS`."""
    files, profiles, scales, services = [], [], {}, []
    up = words.index("up")
    i = 0
    while i < up:
        if words[i] in OPTION_ARGS:
            (files if words[i] in ("-f", "--file") else profiles if words[i] == "--profile" else []).append(words[i + 1])
            i += 2
        else:
            i += 1
    rest = words[up + 1:]
    for j, w in enumerate(rest):
        if w == "--scale":
            service, n = rest[j + 1].split("=")
            scales[service] = int(n) if n.isdigit() else 2  # `rollout=N`: any number
        elif not w.startswith("-") and (j == 0 or rest[j - 1] != "--scale") and re.fullmatch(r"[a-z0-9-]+", w):
            services.append(w)
    return files, profiles, scales, services


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    plan = deploy_plan(ROOT / "configs/searchr1-3b-grpo.toml", source="configs/searchr1-3b-grpo.toml")
    text = compose_gpu.compose_project(plan, yaml.safe_load((ROOT / "docker-compose.yml").read_text()),
                                       compose_gpu.ComposeOptions(compose_v1=True))
    path = tmp_path_factory.mktemp("gpu") / "docker-compose.gpu.yml"
    path.write_text(text)
    return path


def _started(services: dict, named: list[str]) -> set[str]:
    """What `up` starts: the named services and what they depend on, or every service."""
    todo, seen = list(named or services), set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += list(services[name].get("depends_on") or [])
    return seen


def test_the_docs_name_the_commands_this_test_reads():
    commands = {" ".join(w) for _, w in documented_up_commands()}
    assert {"up -d", "up -d --scale rollout=4", "-f docker-compose.gpu.yml up -d",
            "-f docker-compose.yml -f docker-compose.tiny-gpu.yml up -d"} <= commands, commands
    assert _parse(["-f", "a.yml", "--profile", "x", "up", "-d", "--scale", "rollout=N", "redis"]) == (
        ["a.yml"], ["x"], {"rollout": 2}, ["redis"])


def test_no_compose_file_has_a_profile(generated):
    for path in (ROOT / "docker-compose.yml", ROOT / "docker-compose.tiny-gpu.yml", generated):
        services = yaml.safe_load(path.read_text())["services"]
        assert not [n for n, s in services.items() if "profiles" in s], path.name


def test_no_documented_up_starts_two_learners(generated, tmp_path):
    env = tmp_path / "env"
    env.write_text("".join(f"{k}={v}\n" for k, v in SECRETS.items()))
    files_at = {"docker-compose.gpu.yml": generated}
    rendered: dict[tuple, dict] = {}
    for where, words in documented_up_commands():
        files, profiles, scales, named = _parse(words)
        paths = [files_at.get(f, ROOT / f) for f in files or ["docker-compose.yml"]]
        assert all(p.is_file() for p in paths), f"{where}: {words} names a compose file that does not exist"
        key = (*paths, *profiles)
        if key not in rendered:
            argv = [_tool("docker-compose"), "--env-file", str(env), "--project-directory", str(ROOT)]
            argv += [a for p in paths for a in ("-f", str(p))] + [a for p in profiles for a in ("--profile", p)]
            done = subprocess.run([*argv, "config"], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
            assert done.returncode == 0, f"{where}: {words}\n{done.stderr}"
            rendered[key] = yaml.safe_load(done.stdout)["services"]
        services = rendered[key]
        started = _started(services, named)
        learners = sum(scales.get(n, 1) for n in compose_gpu.trainers({n: services[n] for n in started}))
        assert learners <= 1, (where, words, learners)
        if not named:  # the whole project: its one learner
            assert learners == 1, (where, words, learners)
