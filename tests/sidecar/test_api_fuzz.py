"""schemathesis against the sidecar's own OpenAPI document: every route, fuzzed and stateful, with
and without the admin token. No input may give a server error, and every status code answered must
be one the document lists for that route (with a body of the documented shape).

The sidecar is real (uvicorn on loopback, real git repos and state store) with the stub backend;
sealing writes only below a scratch `seal_root`, so fuzzed `output_dir`s never touch the machine.
The runs are bounded (examples per route, steps per scenario) and have no per-example deadline:
a busy machine makes examples slower, never wrong.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ._server import ServerThread, commit_file, make_harness

pytestmark = pytest.mark.timeout(600)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]
"""What every answer must satisfy. Not `positive_data_acceptance`: a schema-valid version string
that names no commit is rightly refused (400), which the document says."""

FUZZ = settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
STATEFUL = settings(
    max_examples=15,
    stateful_step_count=8,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    """A served sidecar with a few commits to evaluate; yields `(url, admin headers, harness)`."""
    root = tmp_path_factory.mktemp("fuzz")
    harness = make_harness(root / "h")
    for i in range(3):
        commit_file(harness.agent_repo, "solve.py", f"print({i})\n", f"change {i}")
    (root / "seal").mkdir()
    app = harness.create_app(seal_root=root / "seal")
    with ServerThread(app) as server:
        yield server.url, harness.admin_headers(), harness


def _document() -> dict:
    """The OpenAPI document, from an app that is never started (it depends on the routes only)."""
    app = make_config_app()
    return app.openapi()


def make_config_app():
    from pathlib import Path

    from vero.sidecar.app import create_app
    from vero.sidecar.paths import SidecarPaths
    from vero.sidecar.service import SidecarService

    from ._server import StubBackend, make_config

    nowhere = Path("/nonexistent/vero-fuzz")
    paths = SidecarPaths(state_dir=nowhere, agent_repo=nowhere, context_dir=nowhere)
    return create_app(SidecarService(make_config("0" * 40), paths, StubBackend(), run_as=None))


schema = schemathesis.openapi.from_dict(_document())


@pytest.fixture(scope="module")
def api_schema(sidecar):
    url, _headers, _harness = sidecar
    return schemathesis.openapi.from_url(f"{url}/openapi.json")


@schema.parametrize()
@FUZZ
def test_agent_input_gives_no_server_error_or_undocumented_status(case, sidecar):
    """Without the admin token: the admin routes must refuse (401), the agent routes answer as documented."""
    url, _headers, _harness = sidecar
    case.call_and_validate(base_url=url, checks=[*CHECKS, ignored_auth], timeout=120)


@schema.parametrize()
@FUZZ
def test_admin_input_gives_no_server_error_or_undocumented_status(case, sidecar):
    url, headers, _harness = sidecar
    case.call_and_validate(base_url=url, headers=headers, checks=CHECKS, timeout=120)


@pytest.mark.parametrize("admin", [False, True], ids=["agent", "admin"])
def test_stateful_sequences_follow_the_document(api_schema, admin, sidecar):
    """Sequences of calls along the document's links (a started evaluation is then read back)."""
    _url, headers, _harness = sidecar

    class Workflow(api_schema.as_state_machine()):
        def get_call_kwargs(self, case):
            return {"headers": headers if admin else None, "timeout": 120}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            case.validate_response(response, checks=CHECKS)

    Workflow.run(settings=STATEFUL)


def test_the_document_lists_the_statuses_found_by_hand(sidecar):
    """The answers the fuzzers must see documented, reached on purpose: a body that is not JSON
    (400), a seal outside its root (422), a method the path does not serve (405 with `Allow`)."""
    import httpx

    url, headers, harness = sidecar
    spec = httpx.get(f"{url}/openapi.json").json()
    seal = spec["paths"]["/admin/seal"]["post"]["responses"]
    for path, method in (("/evaluations", "post"), ("/submissions", "post"), ("/admin/seal", "post")):
        assert {"400", "413", "422", "507"} <= set(spec["paths"][path][method]["responses"]), path
    assert "401" in seal
    with httpx.Client(base_url=url, trust_env=False, timeout=60) as client:
        bad = client.post("/evaluations", content=b"\xff\xfe{", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and bad.json()["code"] == "bad_request"
        outside = client.post("/admin/seal", json={"output_dir": str(harness.root / "elsewhere")}, headers=headers)
        assert outside.status_code == 422 and "must be inside" in outside.json()["detail"]
        for own in (harness.state_dir, harness.context_dir / "x", harness.work_dir):
            inside = client.post("/admin/seal", json={"output_dir": str(own)}, headers=headers)
            assert inside.status_code == 422, own
        too_long = client.post("/admin/seal", json={"output_dir": "/" + "x" * 300}, headers=headers)
        assert too_long.status_code == 422 and "output_dir" in too_long.json()["detail"]
        for method in ("PUT", "DELETE", "OPTIONS"):
            wrong = client.request(method, "/evaluations")
            assert wrong.status_code == 405 and set(wrong.headers["allow"].split(", ")) == {"GET", "POST"}
    assert not (harness.root / "elsewhere").exists()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
_TOOLS = ("health", "status", "start_evaluation", "list_evaluations", "get_evaluation", "submit", "seal", "nope")
_ARGUMENT_NAMES = (
    "partition",
    "version",
    "cases",
    "blocks",
    "job_id",
    "wait_sec",
    "limit",
    "before",
    "state",
    "output_dir",
)


@given(
    tool=st.sampled_from(_TOOLS),
    arguments=st.dictionaries(st.sampled_from(_ARGUMENT_NAMES) | st.text(max_size=8), _JSON, max_size=4),
    raw=st.none() | st.binary(max_size=64) | _JSON,
)
@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
def test_mcp_endpoint_answers_any_body_without_a_server_error(sidecar, tool, arguments, raw):
    """`/mcp` is not in the OpenAPI document (it is a JSON-RPC endpoint): tool calls with arbitrary
    arguments, and arbitrary bodies, get a JSON-RPC answer or a 4xx, never a 5xx."""
    import json

    import httpx

    url, _headers, _harness = sidecar
    if raw is None:
        body = json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
        ).encode()
    else:
        body = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    response = httpx.post(
        f"{url}/mcp",
        content=body,
        timeout=120,
        trust_env=False,
        headers={"content-type": "application/json", "accept": "application/json, text/event-stream"},
    )
    assert response.status_code < 500, response.text
    if raw is None:
        answer = response.json()
        assert answer["id"] == 1 and ("result" in answer or "error" in answer)
