"""Schemathesis against a live server: bounded, deterministic examples for every operation;
0 server errors and 0 conformance failures (status codes, content types, headers, bodies)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import LiveServer

CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
          "response_schema_conformance")


@pytest.mark.slow
@pytest.mark.timeout(660)  # its own longest wait, and a minute to report
def test_the_api_conforms_to_its_schema(tmp_path):
    server = LiveServer(tmp_path / "home").start()
    try:
        # DELETE /v1/tokens/{id} would revoke the fuzzer's own token; revocation is tested in test_roles.
        # A started notebook runs until stopped (a followed log of it never ends): its start is tested in
        # tests/api/test_notebooks.py; the other notebook operations are fuzzed here
        run = subprocess.run(
            [str(Path(sys.executable).with_name("schemathesis")), "run", f"{server.url}/openapi.json",
             "-H", f"Authorization: Bearer {server.admin_token}", "--max-examples", "15",
             "--generation-deterministic", "--exclude-path", "/v1/tokens/{token_id}",
             "--exclude-operation-id", "start_v1_notebooks_post", "--checks", CHECKS],
            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    finally:
        server.stop()
        server.cleanup_jobs()
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failures" not in run.stdout.split("Test cases:")[-1]
