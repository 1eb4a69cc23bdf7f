"""``/healthz`` of a node whose parts run in the API's process (``chronolog dev``): while one
of them is not ready — its processor restoring partitions after a restart — the API is not
ready either, and says which part and why; it answers 200 again once they are. The app runs
in-process (ASGI), without a log or a read model, so only those parts decide."""

from __future__ import annotations

import httpx

from chronolog.api.app import create_app
from chronolog.tenants import Tenants


async def test_healthz_is_503_naming_each_part_of_the_node_that_is_not_ready() -> None:
    not_ready: list[str] = []
    app = create_app(None, None, Tenants(), alongside=lambda: list(not_ready))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://node.test") as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        not_ready.extend(["processor: restoring partitions [2, 3]", "worker: starting"])
        h = await http.get("/healthz")
        assert h.status_code == 503 and h.headers["retry-after"] == "1"
        assert h.json()["message"] == ("processor: restoring partitions [2, 3]; "
                                       "worker: starting")
        not_ready.clear()
        h = await http.get("/healthz")
        assert h.status_code == 200 and h.json() == {"status": "ok"}
