"""KEDA's published definitions as one JSON schema, which tests/unit/test_deploy_keda.py validates every
KEDA object the Kubernetes overlays render against.

    git clone --depth 1 --branch v2.20.2 https://github.com/kedacore/keda /tmp/keda
    python deploy/scripts/keda_schema.py /tmp/keda v2.20.2 > tests/unit/schemas/keda.schema.json

The objects: from KEDA's CustomResourceDefinitions (config/crd/bases/keda.sh_<plural>.yaml) each served
version's `openAPIV3Schema`, made a JSON schema (draft 2020-12) that reads objects as the API server does
with strict field validation (`kubectl apply` since Kubernetes 1.27): an object schema that lists
`properties` accepts no other field (unless `x-kubernetes-preserve-unknown-fields`),
`x-kubernetes-int-or-string` is an integer or a string, `nullable` adds null, `status` is left out (the
server ignores it on create). CEL rules (`x-kubernetes-validations`) are beyond a JSON schema validator:
the output lists them under `x-cel-rules` for the test to check by hand.

A trigger's `metadata` is a map of strings in the CRD; which keys a scaler reads is in its Go source. For
each scaler in SCALERS, the keys are the names in the `keda:"name=…, order=…"` tags of its metadata
struct (nested structs followed) that KEDA reads from the trigger's metadata (`order` has
`triggerMetadata`), and `<name>FromEnv` where it reads the name from the target's environment
(`resolvedEnv`) — pkg/scalers/scalersconfig/typed_config.go.

KEDA is Apache-2.0 licensed: the schema is a derivative of its files and records where they came from
(repository, release, paths, their sha256) and the license. Standard library and PyYAML only.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

REPOSITORY = "https://github.com/kedacore/keda"
CRDS = ("keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml")
"""The kinds the overlays use: ScaledObject, TriggerAuthentication."""
SCALERS = {"redis-streams": "redisStreamsMetadata"}
"""Trigger type -> the Go struct its scaler parses the trigger's metadata into (pkg/scalers/)."""

_STRUCT = re.compile(r"^type (\w+) struct \{\n(.*?)^\}", re.M | re.S)
_FIELD = re.compile(r'^\s*\w+\s+([\w.*\[\]]+)\s+`[^`]*keda:"([^"]*)"', re.M)


def json_schema(node: dict[str, Any], cel: list[dict[str, str]], path: str = "") -> dict[str, Any]:
    """One OpenAPI v3 structural schema node as JSON schema (see the module docstring); CEL rules met on the
    way are appended to `cel` with the path they apply to."""
    out: dict[str, Any] = {}
    for rule in node.get("x-kubernetes-validations", []):
        cel.append({"path": path or ".", "rule": rule["rule"], "message": rule.get("message", "")})
    if node.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    elif "type" in node:
        out["type"] = [node["type"], "null"] if node.get("nullable") else node["type"]
    for key in ("enum", "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "pattern",
                "required", "default"):
        if key in node:
            out[key] = node[key]
    if "properties" in node:
        out["properties"] = {k: json_schema(v, cel, f"{path}.{k}") for k, v in node["properties"].items()}
        if not node.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in node:
            out["additionalProperties"] = False
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = json_schema(node["additionalProperties"], cel, f"{path}.*")
    if "items" in node:
        out["items"] = json_schema(node["items"], cel, f"{path}[]")
    if "anyOf" in node and "anyOf" not in out:
        out["anyOf"] = [json_schema(v, cel, path) for v in node["anyOf"]]
    return out


def crd_schemas(crd: dict[str, Any]) -> tuple[str, dict[str, Any], list[dict[str, str]]]:
    """(kind, JSON schema of its served versions, their CEL rules) of one CustomResourceDefinition."""
    spec = crd["spec"]
    kind, group = spec["names"]["kind"], spec["group"]
    cel: list[dict[str, str]] = []
    versions = []
    for version in (v for v in spec["versions"] if v.get("served")):
        schema = dict(version["schema"]["openAPIV3Schema"])
        schema["properties"] = {k: v for k, v in schema["properties"].items() if k != "status"}
        body = json_schema(schema, cel)
        body["properties"]["apiVersion"] = {"const": f"{group}/{version['name']}"}
        body["properties"]["kind"] = {"const": kind}
        body["properties"]["metadata"] = {"type": "object", "required": ["name"],
                                          "properties": {"name": {"type": "string", "minLength": 1}}}
        body["required"] = sorted({"apiVersion", "kind", "metadata", *body.get("required", [])})
        versions.append(body)
    return kind, versions[0] if len(versions) == 1 else {"oneOf": versions}, cel


def _tag(tag: str) -> dict[str, list[str]]:
    """`name=a;b, order=triggerMetadata;resolvedEnv, optional` -> {"name": ["a", "b"], "order": [...], ...}."""
    out: dict[str, list[str]] = {}
    for part in tag.split(","):
        key, _, value = part.partition("=")
        if key.strip():
            out[key.strip()] = [v.strip() for v in value.split(";") if v.strip()]
    return out


def go_structs(scalers: Path) -> dict[str, tuple[str, str]]:
    """{struct name: (file name, body)} of every struct in KEDA's pkg/scalers/*.go (tests aside)."""
    return {m.group(1): (path.name, m.group(2)) for path in sorted(scalers.glob("*.go"))
            if not path.name.endswith("_test.go") for m in _STRUCT.finditer(path.read_text())}


def metadata_keys(structs: dict[str, tuple[str, str]], struct: str, files: set[str]) -> list[str]:
    """The trigger-metadata keys a scaler's metadata struct reads (see the module docstring); the files
    the structs came from are added to `files`."""
    file, body = structs[struct]
    files.add(file)
    keys: set[str] = set()
    for field_type, tag in _FIELD.findall(body):
        parsed = _tag(tag)
        if "name" not in parsed:  # a nested struct: its own fields carry the names
            keys.update(metadata_keys(structs, field_type.lstrip("*"), files))
            continue
        order = parsed.get("order", ["triggerMetadata"])
        for name in parsed["name"]:
            if "triggerMetadata" in order:
                keys.add(name)
            if "resolvedEnv" in order:
                keys.add(f"{name}FromEnv")
    return sorted(keys)


def _trigger_rules(structs: dict[str, tuple[str, str]], files: set[str]) -> list[dict[str, Any]]:
    return [{"if": {"properties": {"type": {"const": kind}}, "required": ["type"]},
             "then": {"properties": {"metadata": {"propertyNames": {"enum": metadata_keys(structs, struct, files)}}}}}
            for kind, struct in sorted(SCALERS.items())]


def build(keda: Path, version: str) -> dict[str, Any]:
    """The schema document for the KEDA source tree `keda` (a checkout of release `version`)."""
    sources: dict[str, str] = {}
    defs: dict[str, Any] = {}
    cel: dict[str, list[dict[str, str]]] = {}
    for name in CRDS:
        path = keda / "config/crd/bases" / name
        text = path.read_text()
        sources[f"config/crd/bases/{name}"] = hashlib.sha256(text.encode()).hexdigest()
        kind, schema, rules = crd_schemas(yaml.safe_load(text))
        defs[kind], cel[kind] = schema, rules
    files: set[str] = set()
    triggers = defs["ScaledObject"]["properties"]["spec"]["properties"]["triggers"]["items"]
    triggers["allOf"] = _trigger_rules(go_structs(keda / "pkg/scalers"), files)
    for name in sorted(files):
        sources[f"pkg/scalers/{name}"] = hashlib.sha256((keda / "pkg/scalers" / name).read_bytes()).hexdigest()
    kinds = sorted(defs)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": (f"Generated by deploy/scripts/keda_schema.py from KEDA {version} ({REPOSITORY}/tree/{version}),"
                     " Apache-2.0 (Copyright The KEDA Authors). Do not edit: regenerate."),
        "title": f"KEDA {version}: {', '.join(kinds)} (keda.sh), from its CRDs and scaler sources",
        "x-source": {"repository": REPOSITORY, "release": version, "license": "Apache-2.0",
                     "license_url": f"{REPOSITORY}/blob/{version}/LICENSE",
                     "files": {k: {"url": f"{REPOSITORY}/blob/{version}/{k}", "sha256": v}
                               for k, v in sorted(sources.items())}},
        "x-cel-rules": cel,
        "type": "object",
        "required": ["apiVersion", "kind"],
        "properties": {"kind": {"enum": kinds}},
        "allOf": [{"if": {"properties": {"kind": {"const": k}}}, "then": {"$ref": f"#/$defs/{k}"}} for k in kinds],
        "$defs": defs,
    }


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: keda_schema.py KEDA_CHECKOUT RELEASE  (e.g. /tmp/keda v2.20.2)")
    print(json.dumps(build(Path(sys.argv[1]), sys.argv[2]), indent=1, sort_keys=False))
