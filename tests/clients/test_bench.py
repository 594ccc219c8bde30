"""`pyserve bench`: statistics, capacity search and Prometheus parsing on their own, then real runs against a
real `pyserve serve` on a free loopback port (with /tokenize, /metrics and usage in streams, and with them
turned off: the paths for servers that have none)."""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys

import numpy as np
import pytest

from pyserve import bench
from pyserve.bench.launch import ServerProcess

MODEL = "gemma-3-270m-q4_k_m"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pyserve")
    bench.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench", *argv])


# ------------------------------------------------------------------------------------------ no server needed

def test_summarize_matches_numpy_percentiles():
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
    # linear interpolation between ranks, by hand: p50 of 1..4 is 2.5, p90 is 1 + 0.9 * 3
    assert bench.summarize([4, 1, 3, 2]) == {"mean": 2.5, "p50": 2.5, "p90": pytest.approx(3.7),
                                             "p95": pytest.approx(3.85), "p99": pytest.approx(3.97), "max": 4.0}
    assert bench.summarize(x for x in [7.0]) == dict.fromkeys(bench.STAT_KEYS, 7.0)


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


@pytest.mark.parametrize("limit,start,max_rate,res", [(0.5, 1, 64, 0.05), (1, 1, 64, 0.05), (3.3, 1, 64, 0.05),
                                                      (7.77, 1, 64, 0.05), (50.1, 1, 64, 0.05), (1000, 1, 64, 0.05),
                                                      (1000, 2.5, 30, 0.05), (13, 2.5, 30, 0.2), (0.37, 0.1, 8, 0.01)])
def test_search_rate(limit, start, max_rate, res):
    probed = []

    async def probe(rate):
        probed.append(rate)
        return rate <= limit

    found = asyncio.run(bench.search_rate(probe, start, max_rate, res))
    assert all(start <= r <= max_rate for r in probed)
    assert len(probed) == len(set(probed))  # never the same level twice
    assert len(probed) <= math.ceil(math.log2(max_rate / start)) + 1 + math.ceil(math.log2(1 / res)) + 1
    if limit < start:
        assert found == 0.0 and probed == [start]
    elif limit >= max_rate:
        assert found == max_rate and probed[-1] == max_rate
    else:  # a pass at `found`, and a fail within `res` of it above
        assert found in probed and found <= limit
        assert min(r for r in probed if r > limit) <= found * (1 + res)


def test_metrics_delta():
    # (a family's samples stand together, as in any exposition: the code="500" series is new in `after`)
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
    after = before.replace('} 5.0', '} 9.0\nx_requests_total{code="500"} 1').replace("x_running 3", "x_running 0") \
        .replace("_sum 1.5", "_sum 2.5").replace("_count 4", "_count 6")
    d = bench.metrics_delta(before, after)
    assert d == {'x_requests_total{code="200"}': 4.0, 'x_requests_total{code="500"}': 1.0, "x_running": 0.0,
                 "x_latency_seconds_sum": 1.0, "x_latency_seconds_count": 2.0}
    samples, types = bench.parse_metrics(after)
    assert (types["x_requests"], types["x_running"], types["x_latency_seconds"]) == ("counter", "gauge", "histogram")
    assert bench.total(samples, "x_requests_total") == 10.0
    assert bench.total(samples, "x_requests_total", code="500") == 1.0
    assert bench.total(samples, "x_nothing") == 0.0
    assert bench.totals(samples)["x_latency_seconds_count"] == 6.0
    label = 'x_total{path="a\\"b"} 1\n'  # an escaped quote in a label value comes back escaped
    assert bench.metrics_delta("", "# TYPE x_total counter\n" + label) == {'x_total{path="a\\"b"}': 1.0}
    with pytest.raises(ValueError):
        bench.metrics_delta("", "<html>not metrics</html>")


def test_chunk_text():
    assert bench.chunk_text({"choices": [{"text": "ab"}]}) == "ab"
    assert bench.chunk_text({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert bench.chunk_text({"choices": [{"delta": {"content": "x"}}]}) == "x"
    assert bench.chunk_text({"choices": [{"delta": {"content": "x", "reasoning_content": "y"}}]}) == "xy"
    assert bench.chunk_text({"choices": [], "usage": {"completion_tokens": 3}}) == ""


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


def test_argument_checks(monkeypatch, capsys):
    assert bench.run(parse(["--base-url", "http://x", "--concurrency", "1", "--request-rate", "2"])) == 2
    assert bench.run(parse(["--base-url", "http://x", "--find-capacity"])) == 2
    assert bench.run(parse(["--base-url", "http://x", "--input-len", "8", "--shared-prefix-len", "8"])) == 2
    with pytest.raises(SystemExit):
        parse(["--base-url", "http://x", "--concurrency", "0"])
    # --plot without a matplotlib that imports: refused before any request (http://x is never reached)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    capsys.readouterr()
    assert bench.run(parse(["--base-url", "http://x", "--plot", "p.png"])) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--request-rate", "1,2"], "one finite rate"),
    (["--request-rate", "inf"], "one finite rate"),
    (["--request-rate", "4", "--max-request-rate", "2"], "--max-request-rate must be >="),
    (["--request-rate", "4", "--rate-resolution", "0"], "--rate-resolution must be in"),
    (["--request-rate", "4", "--rate-resolution", "1"], "--rate-resolution must be in"),
    (["--request-rate", "4"], "needs --itl-p99-slo and/or --ttft-p99-slo"),
    (["--request-rate", "4", "--itl-p99-slo", "1", "--output-json", "/nonexistent/x.json"], "--output-json"),
    (["--request-rate", "4", "--itl-p99-slo", "1", "--plot", "/nonexistent/x.png"], "--plot /nonexistent/x.png"),
])
def test_rate_search_argument_checks(argv, message, capsys):
    """Refused before any request (http://x is never reached), with what is wrong."""
    assert bench.run(parse(["--base-url", "http://x", "--find-capacity", *argv])) == 2
    assert message in capsys.readouterr().err
    # its flags on a run that is not a rate search
    assert bench.run(parse(["--base-url", "http://x", "--request-rate", "4", "--max-request-rate", "8"])) == 2
    assert "belong to --find-capacity --request-rate" in capsys.readouterr().err


def _rate_level(rate: float, ttft: float, itl: float, errors: int = 0) -> dict:
    ok = [bench.RequestResult(ok=True, ttft=ttft, e2e=ttft + 3 * itl, itl=[itl] * 3, output_tokens=4)] * 4
    lv = bench.level_report(ok + [bench.RequestResult(error="HTTP 503: busy")] * errors, 1.0, 8)
    lv.update(mode="poisson", request_rate=rate)
    return lv


def test_slo_verdicts_and_capacity_line(tmp_path):
    assert bench.slo_failures(_rate_level(1, 0.2, 0.01), 0.05, 1.0) == []
    assert bench.slo_failures(_rate_level(1, 1.5, 0.01), 0.05, 1.0) == ["ttft_p99"]
    assert bench.slo_failures(_rate_level(1, 1.5, 0.06, errors=1), 0.05, 1.0) == ["errors", "itl_p99", "ttft_p99"]
    assert bench.slo_failures(_rate_level(1, 1.5, 0.06), 0.05, None) == ["itl_p99"]  # only the SLOs given
    assert bench.slo_failures(bench.level_report([], 1.0, 8), None, 1.0) == ["errors", "ttft_p99"]
    levels = [_rate_level(2, 0.2, 0.01), _rate_level(4, 0.4, 0.02), _rate_level(8, 1.5, 0.03)]
    for lv in levels:
        lv["slo_failed"] = bench.slo_failures(lv, 0.05, 1.0)
    over = {"request_rate": 8, "failed": ["ttft_p99"], "itl_p99": pytest.approx(0.03), "ttft_p99": 1.5,
            "errors": 0}
    result = {"levels": levels, "capacity": 4.0, "slo": {"itl_p99": 0.05, "ttft_p99": 1.0, "max_concurrency": 8},
              "capacity_search": {"axis": "request_rate", "unit": "requests/s", "start": 2, "max": 64,
                                  "resolution": 0.05, "first_over": over}}
    assert bench.capacity_line(result) == ("capacity: 4 requests/s (Poisson arrivals, at most 8 in flight) within "
                                           "ITL p99 50 ms, TTFT p99 1000 ms; first over: 8 requests/s (TTFT p99 "
                                           "1500.0 ms)")
    bench.plot_levels(result, str(tmp_path / "rate.png"))
    assert (tmp_path / "rate.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result["capacity_search"]["first_over"] = None
    assert bench.capacity_line(result).endswith("; no level tried broke them (the search stops at "
                                                "--max-request-rate 64)")


def test_table_and_plot(tmp_path):
    lv = bench.level_report([], 1.0, 4)
    lv["mode"] = "closed"
    assert lv["completed"] == lv["errors"] == lv["output_tokens"] == 0 and lv["output_tokens_mean"] is None
    head, rule, row, note = bench.format_table([lv]).splitlines()
    assert head.split()[:3] == ["conc", "done", "err"] and row.split() == ["4", "0", "0", "0.00", "0.0"] + ["-"] * 9
    levels = []
    for c in (1, 2, 4):
        r = bench.RequestResult(ok=True, ttft=0.1 * c, e2e=0.5 * c, itl=[0.01 * c] * 4, output_tokens=5)
        bad = bench.RequestResult(error="HTTP 500: boom")
        levels.append(bench.level_report([r, bad], 2.0, c))
    lv = levels[1]
    assert lv["completed"] == 1 and lv["errors"] == 1 and lv["error_messages"] == {"HTTP 500: boom": 1}
    assert lv["output_tokens_per_s"] == 2.5 and lv["requests_per_s"] == 0.5 and lv["output_tokens_mean"] == 5
    assert lv["ttft"]["p50"] == pytest.approx(0.2) and lv["e2e"]["max"] == pytest.approx(1.0)
    assert lv["tpot"]["mean"] == pytest.approx((1.0 - 0.2) / 4) and lv["itl"]["p99"] == pytest.approx(0.02)
    row = bench.format_table(levels).splitlines()[3].split()
    assert row == ["2", "1", "1", "0.50", "2.5", "5.0", "200.0", "200.0", "20.0", "20.0", "200.0", "200.0",
                   "1.00", "1.00"]
    bench.plot_levels({"levels": levels, "capacity": 2, "slo": {"itl_p99": 0.03}}, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------------------- a real server

@pytest.fixture(scope="module")
def server_url():
    with ServerProcess(threads=1) as srv:
        yield srv.url
    assert srv.returncode == 0, "".join(srv.stderr)


def _check_level(lv: dict, sent: int, output_len: int, exact: bool) -> None:
    """A level of `sent` requests that all succeeded; `exact`: the server reported usage (tokens, not chunks)."""
    assert lv["errors"] == 0, lv.get("error_messages")
    assert lv["completed"] == sent
    assert lv["duration_s"] > 0
    assert lv["requests_per_s"] == pytest.approx(sent / lv["duration_s"])
    assert lv["output_tokens_per_s"] == pytest.approx(lv["output_tokens"] / lv["duration_s"])
    assert lv["output_tokens_mean"] == pytest.approx(lv["output_tokens"] / sent)
    if exact:  # ignore_eos: every request ran to max_tokens
        assert lv["output_tokens"] == sent * output_len
    else:  # content chunks: never more than tokens, fewer where deltas merged or text was held back
        assert sent <= lv["output_tokens"] <= sent * output_len
    for key in ("ttft", "itl", "tpot", "e2e"):
        s = lv[key]
        assert set(s) == set(bench.STAT_KEYS), key
        assert 0 < s["p50"] <= s["p90"] <= s["p95"] <= s["p99"] <= s["max"], (key, s)
        assert s["mean"] <= s["max"]
    assert lv["ttft"]["max"] <= lv["e2e"]["max"]
    assert lv["ttft"]["p50"] <= lv["e2e"]["p50"]
    assert lv["tpot"]["max"] <= lv["e2e"]["max"]
    assert lv["itl"]["p50"] <= lv["e2e"]["p50"]


def test_bench_closed_loop(server_url, tmp_path):
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    assert bench.run(parse(["--base-url", server_url, "--concurrency", "1,2", "--num-prompts", "4",
                            "--input-len", "32", "--output-len", "8", "--shared-prefix-len", "16",
                            "--output-json", str(out), "--plot", str(png), "--no-progress"])) == 0
    result = json.loads(out.read_text())
    levels = result["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    assert [lv["mode"] for lv in levels] == ["closed", "closed"]
    cfg = result["config"]
    assert cfg["model"] == MODEL and cfg["base_url"] == server_url and cfg["length_unit"].startswith("tokens")
    assert cfg["prompt_len_mean"] == 32 and cfg["output_len"] == 8 and "api_key" not in cfg
    for lv in levels:
        _check_level(lv, 4, 8, exact=True)
        assert lv["usage_reported"] is True
        assert lv["prompt_tokens_mean"] == 32  # the server's count: the prompts were cut to --input-len exactly
        # the server saw this level's requests: one first token each (recorded before the stream goes on)
        ttft = [v for k, v in lv["server_metrics"].items() if k.startswith("pyserve:time_to_first_token_seconds_count")]
        assert ttft == [4.0], lv["server_metrics"]
        assert lv["server_metrics"]["pyserve:kv_blocks_total" + "{model_name=\"" + MODEL + "\"}"] > 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bench_without_tokenize_usage_or_metrics(server_url, tmp_path):
    """The paths for servers without POST /tokenize, usage in streams or GET /metrics: lengths estimated from
    characters, output tokens counted as content chunks, no server_metrics."""
    out = tmp_path / "plain.json"
    assert bench.run(parse(["--base-url", server_url, "--concurrency", "2", "--num-prompts", "3", "--input-len", "24",
                            "--output-len", "6", "--no-tokenize", "--no-server-metrics", "--warmup", "0",
                            "--extra-body", '{"stream_options": {"include_usage": false}}',
                            "--output-json", str(out), "--no-progress"])) == 0
    result = json.loads(out.read_text())
    assert result["config"]["length_unit"] == "chars/4"
    assert abs(result["config"]["prompt_len_mean"] - 24) <= 1  # estimated: 4 characters a token
    lv, = result["levels"]
    _check_level(lv, 3, 6, exact=False)
    assert lv["usage_reported"] is False and lv["prompt_tokens_mean"] is None and "server_metrics" not in lv


def test_bench_open_loop_and_capacity(server_url, tmp_path):
    out = tmp_path / "rate.json"
    assert bench.run(parse(["--base-url", server_url, "--request-rate", "20", "--num-prompts", "3",
                            "--input-len", "16", "--output-len", "4", "--endpoint", "chat", "--warmup", "0",
                            "--output-json", str(out), "--no-progress"])) == 0
    lv, = json.loads(out.read_text())["levels"]
    assert lv["mode"] == "poisson" and lv["request_rate"] == 20
    assert 1 <= lv["peak_concurrency"] <= 3 and lv["concurrency"] == lv["peak_concurrency"]
    _check_level(lv, 3, 4, exact=True)

    # A generous SLO holds up to --max-concurrency; an impossible one fails at 1.
    out = tmp_path / "cap.json"
    assert bench.run(parse(["--base-url", server_url, "--find-capacity", "--itl-p99-slo", "30",
                            "--ttft-p99-slo", "60", "--max-concurrency", "2", "--num-prompts", "2",
                            "--input-len", "16", "--output-len", "4", "--warmup", "0",
                            "--output-json", str(out), "--no-progress"])) == 0
    result = json.loads(out.read_text())
    assert result["capacity"] == 2
    assert result["slo"] == {"itl_p99": 30.0, "ttft_p99": 60.0, "max_concurrency": 2}
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 2]
    assert all(lv["slo_ok"] for lv in result["levels"])
    assert result["capacity_search"] == {"axis": "concurrency", "unit": "concurrent requests", "start": 1, "max": 2,
                                         "resolution": 1, "first_over": None}
    for lv in result["levels"]:
        _check_level(lv, 2, 4, exact=True)
    assert bench.run(parse(["--base-url", server_url, "--find-capacity", "--ttft-p99-slo", "1e-9",
                            "--num-prompts", "1", "--input-len", "16", "--output-len", "2", "--warmup", "0",
                            "--output-json", str(out), "--no-progress"])) == 0
    result = json.loads(out.read_text())
    assert result["capacity"] == 0 and len(result["levels"]) == 1 and result["levels"][0]["slo_ok"] is False
    assert result["levels"][0]["ttft"]["p99"] > 1e-9
    assert result["levels"][0]["slo_failed"] == ["ttft_p99"]
    over = result["capacity_search"]["first_over"]
    assert over["concurrency"] == 1 and over["failed"] == ["ttft_p99"] and over["ttft_p99"] > 1e-9


def test_open_loop_counts_the_wait_for_a_slot(server_url, tmp_path):
    """Under --max-concurrency 1, three requests that arrive at once are sent one after another: the second and
    third wait for the slot, and their TTFT (from arrival) holds that wait."""
    out = tmp_path / "capped.json"
    assert bench.run(parse(["--base-url", server_url, "--request-rate", "inf", "--max-concurrency", "1",
                            "--num-prompts", "3", "--input-len", "16", "--output-len", "4", "--warmup", "0",
                            "--output-json", str(out), "--no-progress"])) == 0
    lv, = json.loads(out.read_text())["levels"]
    assert lv["request_rate"] is None and lv["peak_concurrency"] == 1 and lv["concurrency"] == 1
    _check_level(lv, 3, 4, exact=True)
    wait = lv["queue_wait"]
    assert set(wait) == set(bench.STAT_KEYS)
    assert 0 < wait["p50"] <= wait["max"]  # two of three waited
    assert wait["max"] < lv["ttft"]["max"] and wait["max"] < lv["e2e"]["max"]


def _rate_search(server_url: str, out, *argv: str) -> dict:
    assert bench.run(parse(["--base-url", server_url, "--find-capacity", "--num-prompts", "3",
                            "--input-len", "16", "--output-len", "4", "--warmup", "0", "--max-concurrency", "2",
                            "--output-json", str(out), "--no-progress", *argv])) == 0
    return json.loads(out.read_text())


def test_bench_rate_capacity(server_url, tmp_path, capsys):
    # Generous SLOs hold at every rate: doubling from 10/s up to the bound, 30/s (not a doubling of 10).
    png = tmp_path / "rate.png"
    result = _rate_search(server_url, tmp_path / "rate.json", "--request-rate", "10", "--max-request-rate", "30",
                          "--itl-p99-slo", "30", "--ttft-p99-slo", "60", "--plot", str(png))
    assert result["capacity"] == 30.0
    assert result["slo"] == {"itl_p99": 30.0, "ttft_p99": 60.0, "max_concurrency": 2}
    assert result["capacity_search"] == {"axis": "request_rate", "unit": "requests/s", "start": 10.0, "max": 30.0,
                                         "resolution": 0.05, "first_over": None}
    assert [lv["request_rate"] for lv in result["levels"]] == [10, 20, 30]
    for lv in result["levels"]:
        assert lv["mode"] == "poisson" and lv["slo_ok"] is True and lv["slo_failed"] == []
        assert 1 <= lv["peak_concurrency"] <= 2 and lv["concurrency"] == 2
        _check_level(lv, 3, 4, exact=True)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "capacity: 30 requests/s (Poisson arrivals, at most 2 in flight) within ITL p99 30000 ms, TTFT p99 " \
           "60000 ms; no level tried broke them (the search stops at --max-request-rate 30)" in capsys.readouterr().out

    # An ITL SLO no server meets breaks the first rate: capacity 0, and the JSON and the report name what broke.
    result = _rate_search(server_url, tmp_path / "over.json", "--request-rate", "10", "--rate-resolution", "0.1",
                          "--itl-p99-slo", "1e-9", "--ttft-p99-slo", "60")
    lv, = result["levels"]
    assert result["capacity"] == 0.0 and lv["request_rate"] == 10 and lv["slo_ok"] is False
    assert lv["slo_failed"] == ["itl_p99"] and lv["itl"]["p99"] > 1e-9
    assert result["capacity_search"]["resolution"] == 0.1
    assert result["capacity_search"]["first_over"] == {"request_rate": 10, "failed": ["itl_p99"], "errors": 0,
                                                       "itl_p99": lv["itl"]["p99"], "ttft_p99": lv["ttft"]["p99"]}
    line = capsys.readouterr().out.splitlines()[-1]
    assert line == (f"capacity: 0 requests/s (Poisson arrivals, at most 2 in flight) within ITL p99 1e-06 ms, "
                    f"TTFT p99 60000 ms; first over: 10 requests/s (ITL p99 {lv['itl']['p99'] * 1000:.1f} ms)")
