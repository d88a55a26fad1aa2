"""The learner's weight server over real HTTP on loopback answers 404 (never 500) for file names that
are not in the snapshot: a NUL byte, a path out of the snapshot, a name that does not exist."""

from __future__ import annotations

import httpx

from searchr1.core.servers import HttpServer
from searchr1.weightsync import WeightPublisher, weights_app
from tests.integration.test_auth_endpoints import tiny_model


async def test_odd_file_names_get_404(tmp_path):
    publisher = WeightPublisher(tmp_path / "weights", keep=3)
    model = tiny_model()
    publisher.write(3, model, model.state_dict())
    server = HttpServer(weights_app(publisher))
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            assert (await http.get("/weights/3/files/config.json")).status_code == 200
            for name in ("config%00.json", "%00", "..%2F..%2Fetc%2Fpasswd", "nope.json"):
                r = await http.get(f"/weights/3/files/{name}")
                assert r.status_code == 404, (name, r.status_code)
    finally:
        await server.stop()
