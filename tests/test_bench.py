"""`pyserve bench`: statistics, capacity search and Prometheus parsing on their own, then real runs against a
real server started on a free loopback port.

The server is pyserve's own (`python -m pyserve serve`). PYSERVE_BENCH_TEST_SERVER=llama-cpp runs the same
tests against llama-cpp-python's OpenAI-compatible server instead (`python -m llama_cpp.server`, needs its
server extras), which has no /tokenize, /metrics or usage in streams: the fallback paths.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pyserve import bench

SERVER = os.environ.get("PYSERVE_BENCH_TEST_SERVER", "pyserve")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pyserve")
    bench.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench", *argv])


# ------------------------------------------------------------------------------------------ no server needed

def test_summarize_matches_numpy_percentiles():
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 101, 1000):
        v = rng.exponential(size=n).tolist()
        s = bench.summarize(v)
        assert s["mean"] == pytest.approx(float(np.mean(v)))
        for q in (50, 90, 95, 99):
            assert s[f"p{q}"] == pytest.approx(float(np.percentile(v, q)))
        assert s["max"] == max(v)
        assert s["p50"] <= s["p90"] <= s["p95"] <= s["p99"] <= s["max"]
    assert bench.summarize([]) == {k: None for k in bench.STAT_KEYS}


@pytest.mark.parametrize("limit,max_c,expected", [(0, 64, 0), (1, 64, 1), (5, 64, 5), (37, 64, 37),
                                                  (64, 64, 64), (1000, 64, 64), (1000, 48, 48), (20, 48, 20)])
def test_search_capacity(limit, max_c, expected):
    probed = []

    async def probe(c):
        probed.append(c)
        return c <= limit

    assert asyncio.run(bench.search_capacity(probe, max_c)) == expected
    assert all(1 <= c <= max_c for c in probed)
    assert len(probed) == len(set(probed))  # never the same level twice
    assert len(probed) <= 2 * max_c.bit_length() + 1


def test_metrics_delta():
    before = """# HELP x_requests_total Requests.
# TYPE x_requests_total counter
x_requests_total{code="200"} 5.0
x_requests_created{code="200"} 1.7e9
# TYPE x_running gauge
x_running 3
# TYPE x_latency_seconds histogram
x_latency_seconds_bucket{le="0.1"} 2
x_latency_seconds_sum 1.5
x_latency_seconds_count 4
"""
    after = before.replace('} 5.0', '} 9.0').replace("x_running 3", "x_running 0") \
        .replace("_sum 1.5", "_sum 2.5").replace("_count 4", "_count 6") + 'x_requests_total{code="500"} 1\n'
    d = bench.metrics_delta(before, after)
    assert d == {'x_requests_total{code="200"}': 4.0, 'x_requests_total{code="500"}': 1.0, "x_running": 0.0,
                 "x_latency_seconds_sum": 1.0, "x_latency_seconds_count": 2.0}


def test_chunk_text():
    assert bench._chunk_text({"choices": [{"text": "ab"}]}) == "ab"
    assert bench._chunk_text({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert bench._chunk_text({"choices": [{"delta": {"content": "x"}}]}) == "x"
    assert bench._chunk_text({"choices": [], "usage": {"completion_tokens": 3}}) == ""


def test_prompts_by_characters_have_the_set_length():
    counter = bench.LengthCounter(None, chars_per_token=4.0)
    maker = bench.PromptMaker(counter, input_len=50, shared_prefix_len=20, seed=1)

    async def make():
        await maker.setup()
        return [await maker.make() for _ in range(20)]

    prompts = asyncio.run(make())
    assert len(set(prompts)) == len(prompts)
    assert all(p.startswith(maker.prefix) and len(maker.prefix) > 60 for p in prompts)
    assert all(abs(n - 50) <= 1 for n in maker.lengths), maker.lengths


def test_argument_checks():
    assert bench.run(parse(["--base-url", "http://x", "--concurrency", "1", "--request-rate", "2"])) == 2
    assert bench.run(parse(["--base-url", "http://x", "--find-capacity"])) == 2
    assert bench.run(parse(["--base-url", "http://x", "--input-len", "8", "--shared-prefix-len", "8"])) == 2
    with pytest.raises(SystemExit):
        parse(["--base-url", "http://x", "--concurrency", "0"])


def test_table_and_plot(tmp_path):
    lv = bench.level_report([], 1.0, 4)
    lv["mode"] = "closed"
    assert "conc" in bench.format_table([lv])
    pytest.importorskip("matplotlib")
    levels = []
    for c in (1, 2, 4):
        r = bench.RequestResult(ok=True, ttft=0.1 * c, e2e=0.5 * c, itl=[0.01 * c] * 4, output_tokens=5)
        levels.append(bench.level_report([r], 1.0, c))
    bench.plot_levels({"levels": levels, "capacity": 2, "slo": {"itl_p99": 0.03}}, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------------------- a real server

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server_url():
    pytest.importorskip("httpx")
    import httpx

    port = _free_port()
    if SERVER == "llama-cpp":
        from pyserve.engine.model_source import resolve_model

        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", resolve_model(None), "--host", "127.0.0.1",
               "--port", str(port), "--n_threads", "1", "--n_ctx", "2048", "--interrupt_requests", "False"]
        ready_path = "/v1/models"
    else:
        cmd = [sys.executable, "-m", "pyserve", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--threads", "1"]
        ready_path = "/health"
    log = tempfile.TemporaryFile()
    import pyserve  # the server runs the pyserve the tests import (installed, or built in place)

    here = str(Path(pyserve.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(cmd, cwd=here, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"{SERVER} server exited with {proc.returncode}:\n{log.read().decode()[-3000:]}")
            try:
                if httpx.get(url + ready_path, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{SERVER} server not ready in 120 s")
            time.sleep(0.25)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _check_level(lv: dict, output_len: int) -> None:
    assert lv["completed"] > 0
    assert lv["errors"] == 0, lv.get("error_messages")
    assert lv["output_tokens_per_s"] > 0 and lv["requests_per_s"] > 0
    for key in ("ttft", "itl", "tpot", "e2e"):
        s = lv[key]
        assert set(bench.STAT_KEYS) <= set(s), key
        assert 0 < s["p50"] <= s["p90"] <= s["p95"] <= s["p99"] <= s["max"], (key, s)
        assert s["mean"] <= s["max"]
    assert lv["ttft"]["max"] <= lv["e2e"]["max"]
    assert lv["ttft"]["p50"] <= lv["e2e"]["p50"]
    assert lv["tpot"]["max"] <= lv["e2e"]["max"]
    assert 1 < lv["output_tokens_mean"] <= output_len


def test_bench_closed_loop(server_url, tmp_path):
    out = tmp_path / "bench.json"
    argv = ["--base-url", server_url, "--concurrency", "1,2", "--num-prompts", "4", "--input-len", "32",
            "--output-len", "8", "--shared-prefix-len", "16", "--output-json", str(out), "--no-progress"]
    try:
        import matplotlib  # noqa: F401
        argv += ["--plot", str(tmp_path / "bench.png")]
    except ImportError:
        pass
    assert bench.run(parse(argv)) == 0
    result = json.loads(out.read_text())
    levels = result["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    for lv in levels:
        assert lv["completed"] + lv["errors"] == 4
        _check_level(lv, 8)
    if SERVER == "pyserve":  # exact lengths: /tokenize and usage in the stream
        assert result["config"]["length_unit"].startswith("tokens")
        for lv in levels:
            assert lv["usage_reported"] is True
            assert lv["output_tokens_mean"] == 8  # ignore_eos
            assert lv["prompt_tokens_mean"] == 32
            assert lv["server_metrics"]
    if "--plot" in argv:
        assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_open_loop_and_capacity(server_url, tmp_path):
    out = tmp_path / "rate.json"
    # llama-cpp's chat endpoint ignores ignore_eos, and its tiny model may answer nothing.
    endpoint = "chat" if SERVER == "pyserve" else "completions"
    assert bench.run(parse(["--base-url", server_url, "--request-rate", "20", "--num-prompts", "3",
                            "--input-len", "16", "--output-len", "4", "--endpoint", endpoint, "--warmup", "0",
                            "--output-json", str(out), "--no-progress"])) == 0
    lv = json.loads(out.read_text())["levels"][0]
    assert lv["mode"] == "poisson" and lv["request_rate"] == 20 and lv["completed"] + lv["errors"] == 3
    assert lv["errors"] == 0, lv.get("error_messages")

    # A generous SLO holds up to --max-concurrency; an impossible one fails at 1.
    out = tmp_path / "cap.json"
    assert bench.run(parse(["--base-url", server_url, "--find-capacity", "--itl-p99-slo", "30",
                            "--ttft-p99-slo", "60", "--max-concurrency", "2", "--num-prompts", "2",
                            "--input-len", "16", "--output-len", "4", "--warmup", "0",
                            "--output-json", str(out), "--no-progress"])) == 0
    result = json.loads(out.read_text())
    assert result["capacity"] == 2
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 2]
    assert all(lv["slo_ok"] for lv in result["levels"])
    for lv in result["levels"]:
        _check_level(lv, 4)
    assert bench.run(parse(["--base-url", server_url, "--find-capacity", "--ttft-p99-slo", "1e-9",
                            "--num-prompts", "1", "--input-len", "16", "--output-len", "2", "--warmup", "0",
                            "--output-json", str(out), "--no-progress"])) == 0
    result = json.loads(out.read_text())
    assert result["capacity"] == 0 and len(result["levels"]) == 1
