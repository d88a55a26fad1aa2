"""Every command a GPU user copies from docs/reproduce.md and the README's "A real run" section exists,
with those flags, on the stack the tests run (the way tests/unit/test_deploy.py checks the command lines
of the compose files and manifests): `searchr1 …` against the CLI's own command tree, `hf …` against
huggingface_hub's (`hf download`; `huggingface-cli` is no longer shipped), `pip install` against the
constraints files and extras it names, `python -m M` against an importable module, `kubectl apply -k`
against an overlay that exists, `docker compose -f F` against a compose file that exists or the one
`searchr1 deploy compose --out F` on the same page writes. A command in a comment (`# … instead: pip
install …`) is read too."""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import typer.main

ROOT = Path(__file__).resolve().parents[2]


def _blocks(text: str) -> list[str]:
    """The lines of the fenced code blocks, continuations joined; in a comment, what follows `instead:`."""
    out = []
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            code, _, comment = line.partition("  #")
            if code.strip().startswith("#"):
                code, comment = "", code.strip().lstrip("#")
            out.append(code.strip())
            if "instead:" in comment:
                out.append(comment.split("instead:", 1)[1].strip())
    return [line for line in out if line]


def _real_run(readme: str) -> str:
    start = readme.index("## A real run")
    end = readme.index("\n## ", start + 3)
    return readme[start:end]


SOURCES = {"docs/reproduce.md": lambda t: t, "README.md": _real_run}


def _commands() -> list[tuple[str, list[str]]]:
    out = []
    for name, section in SOURCES.items():
        for line in _blocks(section((ROOT / name).read_text())):
            for part in re.split(r"&&|\|\||;|\|", line):
                try:
                    words = shlex.split(part)
                except ValueError:
                    continue
                while words and re.fullmatch(r"[A-Za-z_]+=\S*", words[0]):  # VAR=value before a command
                    words = words[1:]
                if words:
                    out.append((name, words))
    return out


def _walk(root, argv: list[str], where: str) -> None:
    cmd, i = root, 0
    while hasattr(cmd, "commands") and i < len(argv) and argv[i] in cmd.commands:
        cmd = cmd.commands[argv[i]]
        i += 1
    assert not hasattr(cmd, "commands"), f"{where}: {argv} does not name a command"
    known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    for tok in argv[i:]:
        if tok.startswith("-") and tok != "-":
            assert tok.split("=")[0] in known, f"{where}: {cmd.name} has no option {tok} (known: {sorted(known)})"


def test_the_pages_name_the_commands_this_test_reads():
    kinds = {words[0] for _, words in _commands()}
    assert {"searchr1", "hf", "pip", "python3.11", "docker"} <= kinds, kinds
    lines = [" ".join(w) for _, w in _commands()]
    assert any(line.startswith("pip install -c deploy/constraints-cu129.txt") for line in lines), lines
    assert not any(w[0] == "huggingface-cli" for _, w in _commands())


def test_every_searchr1_command_exists_with_its_flags():
    from searchr1.cli import build_app

    root = typer.main.get_command(build_app())
    found = [(where, w[1:]) for where, w in _commands() if w[0] == "searchr1"]
    assert len(found) >= 7, found
    for where, argv in found:
        _walk(root, argv, where)


def test_every_hf_command_exists_with_its_flags():
    """`hf` as installed (huggingface_hub's CLI): each command answers `--help`, which lists each flag."""
    import subprocess
    import sys

    pytest.importorskip("huggingface_hub.cli.hf")
    found = [(where, w[1:]) for where, w in _commands() if w[0] == "hf"]
    assert found
    for where, argv in found:
        words = [w for w in argv if not w.startswith("-")]
        command = words[:1]  # `hf download REPO …`: the command, then its arguments
        done = subprocess.run([sys.executable, "-c", "from huggingface_hub.cli.hf import main; main()", *command,
                               "--help"], capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, f"{where}: hf {command[0]} does not exist: {done.stderr[-500:]}"
        for flag in (w.split("=")[0] for w in argv if w.startswith("-")):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", done.stdout), f"{where}: hf {command[0]} has no {flag}"


def test_every_pip_install_names_a_route_and_extras_that_exist():
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    found = [(where, w) for where, w in _commands() if w[:2] == ["pip", "install"]]
    assert found
    for where, words in found:
        for flag, value in zip(words, words[1:]):
            if flag in ("-c", "-r"):
                assert (ROOT / value).is_file(), f"{where}: {value} does not exist"
            if flag == "-e":
                m = re.fullmatch(r"\.\[([^\]]*)\]", value)
                assert m and set(m.group(1).split(",")) <= extras, f"{where}: {value}"


def test_every_module_and_overlay_and_compose_file_exists():
    written = {w[w.index("--out") + 1] for _, w in _commands() if w[:3] == ["searchr1", "deploy", "compose"]
               and "--out" in w}
    for where, words in _commands():
        if words[0].startswith("python") and words[1:2] == ["-m"]:
            assert words[2] == "venv" or importlib.util.find_spec(words[2]), f"{where}: {words}"
        if words[:3] == ["kubectl", "apply", "-k"]:
            assert (ROOT / words[3]).is_dir(), f"{where}: {words}"
        if words[:2] == ["docker", "compose"] and "-f" in words:
            f = words[words.index("-f") + 1]
            assert f in written or (ROOT / f).is_file(), f"{where}: {words}"
