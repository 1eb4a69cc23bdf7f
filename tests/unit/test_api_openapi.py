"""The committed ``schemas/api/openapi.json`` matches the API (no drift; ``make schemas``)."""

from __future__ import annotations

import json
from pathlib import Path

from chronolog.api.app import openapi_document, openapi_json

ROOT = Path(__file__).resolve().parents[2]


def test_committed_openapi_matches_the_app() -> None:
    on_disk = (ROOT / "schemas" / "api" / "openapi.json").read_text()
    assert on_disk == openapi_json(), "run `make schemas` and commit schemas/api/openapi.json"


def test_the_contract_paths_and_error_body_are_documented() -> None:
    doc = openapi_document()
    paths = doc["paths"]
    assert {"/v1/schedules", "/v1/schedules/{schedule_id}", "/v1/schedules/{schedule_id}:pause",
            "/v1/schedules/{schedule_id}:resume", "/v1/schedules/{schedule_id}/runs",
            "/v1/runs/{run_id}", "/v1/runs/{run_id}:cancel", "/v1/runs/{run_id}:redrive",
            "/v1/runs/{run_id}:reconcile", "/v1/preview", "/healthz", "/metrics"} <= set(paths)
    error = doc["components"]["schemas"]["ErrorBody"]
    assert {"error", "field", "message"} <= set(error["properties"])
    create = paths["/v1/schedules"]["post"]
    assert {"201", "400", "401", "403", "409", "429", "503"} <= set(create["responses"])
    assert "428" in paths["/v1/schedules/{schedule_id}"]["put"]["responses"]
    patch = paths["/v1/schedules/{schedule_id}"]["patch"]
    assert {"200", "400", "404", "409", "415", "428"} <= set(patch["responses"])
    assert {"application/merge-patch+json", "application/json"} == set(
        patch["requestBody"]["content"])
    assert "202" in paths["/v1/runs/{run_id}:cancel"]["post"]["responses"]
    body = doc["components"]["schemas"]["ScheduleIn"]["properties"]
    assert {"scheduleId", "cron", "timezone", "every", "anchor", "at", "job", "misfire", "overlap",
            "retry", "lease", "startDeadline", "jitter", "dst", "effects"} <= set(body)
    json.dumps(doc)  # serializable


def test_the_lists_and_the_visibility_of_writes_are_documented() -> None:
    paths = openapi_document()["paths"]
    for path, params in (
        ("/v1/schedules", {"state", "jobType", "resourceClass", "prefix", "limit", "after"}),
        ("/v1/runs", {"state", "jobType", "scheduleId", "from", "to", "limit", "after"}),
        ("/v1/dlq", {"consumer", "limit", "after"}),
    ):
        op = paths[path]["get"]
        assert {p["name"] for p in op["parameters"] if p["in"] == "query"} == params, path
        assert {"200", "400", "401", "500", "503"} <= set(op["responses"]), path
    writes = [(path, op) for path, item in paths.items() for method, op in item.items()
              if method in ("post", "put", "patch", "delete") and path != "/v1/preview"]
    assert len(writes) == 13
    for path, op in writes:
        ok = [r for code, r in op["responses"].items() if code.startswith("2")]
        assert ok and all({"X-Chronolog-Visible", "X-Chronolog-Consistency"}
                          <= set(r.get("headers", {})) for r in ok), path


def test_the_api_version_is_the_packages() -> None:
    from importlib.metadata import version

    from chronolog.environment import package_version

    assert openapi_document()["info"]["version"] == version("chronolog") == package_version()


def test_the_documented_schedule_bodies_are_valid_with_one_rule() -> None:
    from chronolog.api.models import ScheduleIn
    from chronolog.queries.documents import ScheduleDefinition, to_spec

    schemas = openapi_document()["components"]["schemas"]
    for name, model in (("ScheduleIn", ScheduleIn), ("ScheduleDefinition", ScheduleDefinition)):
        examples = schemas[name]["examples"]
        assert examples, name
        for body in examples:
            assert [k for k in ("cron", "every", "at", "delay") if k in body] == ["every"]
            to_spec(model.model_validate(body))  # what the API accepts
