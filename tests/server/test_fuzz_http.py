"""Fuzzing the live server with schemathesis, driven by its own /openapi.json: zero 5xx, zero crashes.

The server runs with --ctx-size 64 so that a generated request without max_tokens (which defaults to the
rest of the context) stays short, and the schema handed to schemathesis caps max_tokens at 4 and n at 2.
Bounded: `-n 30` examples per operation in the fuzzing and stateful phases (about 45 s on 2 cores). Set
PYSERVE_FUZZ_COVERAGE=1 to add schemathesis' coverage phase (boundary and negative values; ~40 s more).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx

from support.live_server import Server

KEY = "fuzz-key"


def _integer_schemas(s):
    """The integer schemas of a property: itself, or the branches of its anyOf (a nullable field)."""
    if not isinstance(s, dict):
        return []
    return [x for x in [s, *s.get("anyOf", [])] if isinstance(x, dict) and x.get("type") == "integer"]


def _cap(o):
    """max_tokens <= 4 and n <= 2 in every request schema, so generation stays short."""
    if isinstance(o, dict):
        for k in ("max_tokens", "max_completion_tokens"):
            for x in _integer_schemas(o.get(k)):
                x["maximum"] = 4
        for x in _integer_schemas(o.get("n")):
            x["maximum"] = 2
        for v in o.values():
            _cap(v)
    elif isinstance(o, list):
        for v in o:
            _cap(v)
    return o


def test_schemathesis_no_server_errors(tmp_path):
    srv = Server("--api-key", KEY, "--ctx-size", "64", "--max-body-size", "1M").wait_ready()
    try:
        doc = httpx.get(srv.url + "/openapi.json").json()
        assert doc["openapi"].startswith("3.") and "/v1/chat/completions" in doc["paths"]
        schema = tmp_path / "openapi.json"
        schema.write_text(json.dumps(_cap(doc)))
        phases = "examples,fuzzing,stateful" + (",coverage" if os.environ.get("PYSERVE_FUZZ_COVERAGE") else "")
        cmd = [sys.executable, "-m", "schemathesis.cli", "run", str(schema), "--url", srv.url,
               "-H", f"Authorization: Bearer {KEY}", "--checks", "not_a_server_error", "-n", "30",
               "--phases", phases, "--request-timeout", "30", "-w", "2", "--seed", "20261129", "--no-color"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path)
        report = out.stdout + out.stderr
        print(report[-3000:])
        assert out.returncode == 0, report[-6000:] + "".join(srv.stderr)[-4000:]
        assert "Server error" not in report and "Network Error" not in report, report[-6000:]
        assert httpx.get(srv.url + "/health").status_code == 200
    finally:
        code = srv.stop()
    log = "".join(srv.stderr)
    assert "Traceback" not in log and "request failed" not in log, log[-6000:]
    assert code == 0, log[-3000:]
