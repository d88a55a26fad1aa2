"""A local stand-in for the Hugging Face Hub's upload API, enough for `HfApi(endpoint=…).create_repo` and
`upload_folder` over git-LFS's basic transfer (the Hub cannot be reached here): `POST /api/repos/create`,
`POST /api/validate-yaml` (the model card's front matter parses), `POST /api/models/{repo}/preupload/{rev}`
(safetensors files as LFS, the rest inline, as the Hub's default
.gitattributes does), `POST /{repo}.git/info/lfs/objects/batch` (a PUT href and a verify href on this
server), the PUT and the verify, and `POST /api/models/{repo}/commit/{rev}` (NDJSON: the header, inline
files, LFS pointers). A commit whose LFS object was never uploaded, or whose object's sha256 or size differs
from the pointer, is refused with 400. Files land in `root/{owner}/{name}/`; `commits` records each commit.

It has no Xet storage: tests set `huggingface_hub.constants.HF_HUB_DISABLE_XET` so the client takes the LFS
path. Requests must carry `Authorization: Bearer TOKEN` when the hub is made with a token."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


class LocalHubUploads:
    """`with LocalHubUploads(root, token="t") as hub:` → `hub.endpoint`; `hub.repos`, `hub.commits`."""

    def __init__(self, root: Path, token: str | None = None) -> None:
        self.root = Path(root)
        self.token = token
        self.repos: dict[str, dict] = {}
        self.commits: list[dict] = []
        self.objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.card_meta: dict | None = None
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _reply(self, status: int, body: dict | None = None) -> None:
                data = json.dumps(body or {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _authorized(self) -> bool:
                if hub.token is None or self.headers.get("Authorization") == f"Bearer {hub.token}":
                    return True
                self._reply(401, {"error": "Invalid credentials in Authorization header"})
                return False

            def do_POST(self) -> None:  # noqa: N802
                path = self.path.split("?")[0]
                hub.requests.append(("POST", path))
                body = self._body()
                if path.startswith("/lfs-verify/"):
                    doc = json.loads(body)
                    ok = doc.get("oid") in hub.objects and len(hub.objects[doc["oid"]]) == doc.get("size")
                    return self._reply(200 if ok else 404, {})
                if not self._authorized():
                    return None
                if path == "/api/validate-yaml":  # the model card's front matter must be YAML with a known shape
                    return self._validate_card(json.loads(body).get("content", ""))
                if path == "/api/repos/create":
                    doc = json.loads(body)
                    repo = f"{doc.get('organization') or 'user'}/{doc['name']}"
                    hub.repos.setdefault(repo, {"private": bool(doc.get("private"))})
                    return self._reply(200, {"url": f"{hub.endpoint}/{repo}", "name": repo})
                parts = path.strip("/").split("/")
                if path.endswith("/info/lfs/objects/batch"):
                    doc = json.loads(body)
                    objects = []
                    for obj in doc["objects"]:
                        objects.append({"oid": obj["oid"], "size": obj["size"], "actions": {
                            "upload": {"href": f"{hub.endpoint}/lfs-upload/{obj['oid']}"},
                            "verify": {"href": f"{hub.endpoint}/lfs-verify/{obj['oid']}"}}})
                    return self._reply(200, {"transfer": "basic", "objects": objects})
                if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "preupload":
                    files = json.loads(body)["files"]
                    return self._reply(200, {"files": [
                        {"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(".safetensors") else "regular",
                         "shouldIgnore": False} for f in files]})
                if len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "commit":
                    return self._commit(f"{parts[2]}/{parts[3]}", body)
                return self._reply(404, {"error": f"unknown endpoint {path}"})

            def _validate_card(self, content: str) -> None:
                import yaml

                errors = []
                if not content.startswith("---\n") or "\n---\n" not in content[4:]:
                    errors.append({"message": "no YAML front matter"})
                else:
                    try:
                        meta = yaml.safe_load(content[4:content.index("\n---\n", 4)])
                        if not isinstance(meta, dict) or not isinstance(meta.get("tags", []), list):
                            errors.append({"message": "metadata must be a mapping with a tags list"})
                        hub.card_meta = meta
                    except yaml.YAMLError as exc:
                        errors.append({"message": f"invalid YAML: {exc}"})
                return self._reply(400 if errors else 200, {"errors": errors, "warnings": []})

            def _commit(self, repo: str, body: bytes) -> None:
                if repo not in hub.repos:
                    return self._reply(404, {"error": f"repository {repo} not found"})
                lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                out = hub.root / repo
                files: dict[str, bytes] = {}
                for line in lines:
                    value = line["value"]
                    if line["key"] == "file":
                        files[value["path"]] = base64.b64decode(value["content"])
                    elif line["key"] == "lfsFile":
                        data = hub.objects.get(value["oid"])
                        if data is None or hashlib.sha256(data).hexdigest() != value["oid"] or len(data) != value["size"]:
                            return self._reply(400, {"error": f"LFS object of {value['path']} missing or wrong"})
                        files[value["path"]] = data
                for name, data in files.items():
                    (out / name).parent.mkdir(parents=True, exist_ok=True)
                    (out / name).write_bytes(data)
                header = next((line["value"] for line in lines if line["key"] == "header"), {})
                hub.commits.append({"repo": repo, "summary": header.get("summary"), "files": sorted(files)})
                return self._reply(200, {"commitUrl": f"{hub.endpoint}/{repo}/commit/{COMMIT}", "commitOid": COMMIT,
                                         "success": True})

            def do_PUT(self) -> None:  # noqa: N802
                path = self.path.split("?")[0]
                hub.requests.append(("PUT", path))
                data = self._body()
                oid = path.rsplit("/", 1)[-1]
                if not path.startswith("/lfs-upload/") or hashlib.sha256(data).hexdigest() != oid:
                    return self._reply(400, {"error": "bad upload"})
                hub.objects[oid] = data
                return self._reply(200, {})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LocalHubUploads:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
