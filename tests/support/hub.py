"""A local stand-in for the Hugging Face Hub's file endpoint, enough for `huggingface_hub.hf_hub_download`
and `get_hf_file_metadata` with `endpoint=` pointing at it: `HEAD|GET /datasets/{owner}/{name}/resolve/
{revision}/{path}` serves `root/{owner}/{name}/{path}` with the headers the hub sends for an LFS file
(commit, ETag = sha256, size) and byte ranges. It counts GETs per path so tests can see what was fetched."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class LocalHub:
    """`with LocalHub(root) as hub:` → `hub.endpoint`; `hub.gets[path]` counts downloads; `hub.etags`
    overrides the ETag of a path (to serve a file that does not match its advertised sha256). With
    `host="0.0.0.0"` containers reach it too, on the host's address and `hub.port`."""

    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root = Path(root)
        self.gets: Counter[str] = Counter()
        self.etags: dict[str, str] = {}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _file(self) -> tuple[Path, str] | None:
                parts = self.path.split("?")[0].strip("/").split("/")
                if len(parts) < 6 or parts[0] != "datasets" or parts[3] != "resolve":
                    return None
                rel = "/".join([parts[1], parts[2], *parts[5:]])
                f = hub.root / rel
                return (f, rel) if f.is_file() else None

            def _headers(self, f: Path, rel: str, length: int, status: int = 200,
                         content_range: str | None = None) -> None:
                data_sha = hub.etags.get(rel) or hashlib.sha256(f.read_bytes()).hexdigest()
                self.send_response(status)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{data_sha}"')
                self.send_header("X-Linked-Etag", f'"{data_sha}"')
                self.send_header("X-Linked-Size", str(f.stat().st_size))
                self.send_header("Content-Length", str(length))
                self.send_header("Accept-Ranges", "bytes")
                if content_range:
                    self.send_header("Content-Range", content_range)
                self.end_headers()

            def do_HEAD(self) -> None:  # noqa: N802
                found = self._file()
                if found is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                f, rel = found
                self._headers(f, rel, f.stat().st_size)

            def do_GET(self) -> None:  # noqa: N802
                found = self._file()
                if found is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                f, rel = found
                hub.gets[rel] += 1
                data = f.read_bytes()
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[6:].split("-")[0] or 0)
                    body = data[start:]
                    self._headers(f, rel, len(body), 206, f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    body = data
                    self._headers(f, rel, len(body))
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LocalHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def split_into_parts(data: bytes, folder: Path, names: tuple[str, ...]) -> None:
    """Write `data` as consecutive parts (`split -n`-style) under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-len(data) // len(names))
    for i, name in enumerate(names):
        (folder / name).write_bytes(data[i * step:(i + 1) * step])
