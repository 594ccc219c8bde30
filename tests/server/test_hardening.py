"""The HTTP edge: request validation, API keys, CORS, rate limits, queue admission, slow and bad connections.

Unit tests for the pieces (protocol, auth, admission) and end-to-end tests against real `pyserve serve`
processes on loopback ports."""
from __future__ import annotations

import gc
import json
import os
import socket
import time

import httpx
import pytest
import trio

from pyserve.api.base.errors import OpenAIError, from_engine
from pyserve.api.base.protocol import parse_body
from pyserve.api.chat.protocol import ChatCompletionRequest
from pyserve.api.completions.protocol import CompletionRequest
from pyserve.bench.prometheus import parse_metrics, total
from pyserve.server.admission import AdmissionQueue, RateLimiter, TokenBucket
from pyserve.server.auth import AccessConfig, load_keys, match_key
from support.live_server import CHAT, MODEL, Server

# ---- validation (unit) ----

def parse_chat(body: dict) -> ChatCompletionRequest:
    return parse_body(ChatCompletionRequest, json.dumps(body).encode())


def parse_completion(body: dict) -> CompletionRequest:
    return parse_body(CompletionRequest, json.dumps(body).encode())


U = [{"role": "user", "content": "hi"}]

BAD_CHAT = [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": ["x"]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "bogus", "text": "x"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]"),
    ({"messages": U, "temperature": 2.5}, "temperature"),
    ({"messages": U, "temperature": -0.1}, "temperature"),
    ({"messages": U, "temperature": "1"}, "temperature"),
    ({"messages": U, "top_p": 0}, "top_p"),
    ({"messages": U, "top_p": 1.01}, "top_p"),
    ({"messages": U, "n": 0}, "n"),
    ({"messages": U, "n": 17}, "n"),
    ({"messages": U, "n": True}, "n"),
    ({"messages": U, "max_tokens": 0}, "max_tokens"),
    ({"messages": U, "max_completion_tokens": -3}, "max_completion_tokens"),
    ({"messages": U, "max_tokens": 1.5}, "max_tokens"),
    ({"messages": U, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": U, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": U, "stop": ["a"] * 17}, "stop"),
    ({"messages": U, "stop": "x" * 257}, "stop"),
    ({"messages": U, "stop": [1]}, "stop"),
    ({"messages": U, "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"messages": U, "logit_bias": {"5": 101}}, "logit_bias"),
    ({"messages": U, "logit_bias": {"5": "1"}}, "logit_bias"),
    ({"messages": U, "logit_bias": [1]}, "logit_bias"),
    ({"messages": U, "presence_penalty": 3}, "presence_penalty"),
    ({"messages": U, "frequency_penalty": -2.5}, "frequency_penalty"),
    ({"messages": U, "top_k": -2}, "top_k"),
    ({"messages": U, "min_p": 1.5}, "min_p"),
    ({"messages": U, "seed": "x"}, "seed"),
    ({"messages": U, "stream": "yes"}, "stream"),
    ({"messages": U, "stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
    ({"messages": U, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": U, "user": 5}, "user"),
    ({"messages": U, "model": 5}, "model"),
    ({"messages": U, "chat_template_kwargs": []}, "chat_template_kwargs"),
    ({"messages": U, "tools": [{"type": "function"}]}, "tools"),
    ({"messages": U, "min_tokens": 1 << 43}, "min_tokens"),  # beyond the engine's int (found by schemathesis)
]

BAD_COMPLETION = [
    ({}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[1], []]}, "prompt"),
    ({"prompt": ["a"] * 65}, "prompt"),
    ({"prompt": ["a"] * 16, "n": 16}, "n"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "echo": "no"}, "echo"),
    ({"prompt": "x", "suffix": 5}, "suffix"),
    ({"prompt": "x", "suffix": "y", "echo": True}, "echo"),  # fill-in-the-middle echoes no prompt
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "best_of": 3}, "best_of"),
]


@pytest.mark.parametrize("body,param", BAD_CHAT)
def test_chat_validation(body, param):
    with pytest.raises(OpenAIError) as ei:
        parse_chat(body)
    assert ei.value.status == 400 and ei.value.param == param, ei.value.message


@pytest.mark.parametrize("body,param", BAD_COMPLETION)
def test_completion_validation(body, param):
    with pytest.raises(OpenAIError) as ei:
        parse_completion(body)
    assert ei.value.status == 400 and ei.value.param == param, ei.value.message


def test_valid_requests_pass():
    r = parse_chat({"messages": [{"role": "developer", "content": "be brief"},
                                 {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                                 {"role": "assistant", "content": None},
                                 {"role": "tool", "tool_call_id": "call_1", "content": "42"}],
                    "temperature": 2, "top_p": 1, "n": 16, "logprobs": True, "top_logprobs": 20,
                    "stop": ["a"] * 16, "logit_bias": {"5": -100, "7": 100}, "seed": -1})
    params = r.to_sampling_params()
    assert r.n == 16 and params.logit_bias == {5: -100.0, 7: 100.0} and params.seed >= 0
    r = parse_completion({"prompt": [[1, 2], [3]], "logprobs": 20, "stop": None, "max_tokens": None})
    assert len(r.prompts) == 2 and r.logprobs == 20


def test_vocabulary_checks_are_the_engines(llm):
    """Token ids in logit_bias and stop_token_ids are checked by the engine (one rule, one place), and its
    refusal names the field as OpenAI's `param`."""
    n_vocab = llm.engine.hparams["n_vocab"]
    for body, param in [({"prompt": "x", "logit_bias": {str(n_vocab): 1}}, "logit_bias"),
                        ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
                        ({"prompt": [5, n_vocab]}, "prompt")]:
        req = parse_completion(body)
        ids = req.prompts[0] if isinstance(req.prompts[0], list) else [2, 5]
        params = req.to_sampling_params(max_tokens=4)
        with pytest.raises(ValueError) as ei:
            llm.engine.check_request("r", ids, params.engine_sampling(), 4, False, list(params.stop_token_ids))
        err = from_engine(ei.value)
        assert err.status == 400 and err.param == param, err.message
    assert llm.engine.stats()["waiting"] == 0


@pytest.mark.parametrize("data", [b"\xff\xfe{", b'{"prompt": "\xc3\x28"}', b"", b"   ", b"{not json",
                                  b'{"prompt": NaN}', b'{"temperature": Infinity}', b"[" * 100000 + b"]" * 100000,
                                  b'{"prompt": "\\ud800"}', b'{"a": ' * 70 + b"1" + b"}" * 70,
                                  b'{"prompt": "x", "a": ' + b"[" * 201 + b"]" * 201 + b"}"])
def test_parse_body_refuses(data):
    with pytest.raises(OpenAIError) as ei:
        parse_body(CompletionRequest, data)
    assert ei.value.status == 400


def test_parse_body_accepts():
    assert parse_body(CompletionRequest, b'\xef\xbb\xbf{"prompt": "\\ud83d\\ude00"}').prompt == "\U0001F600"


# ---- auth (unit) ----

def test_load_keys(tmp_path, monkeypatch):
    f = tmp_path / "keys"
    f.write_text("# comment\nk3\n\n  k4  \nk1\n")
    monkeypatch.setenv("PYSERVE_API_KEY", "kenv")
    assert load_keys(["k1", "k2"], str(f)) == ["k1", "k2", "kenv", "k3", "k4"]
    with pytest.raises(ValueError):
        load_keys([" "], None, env=False)
    keys = ["alpha", "beta"]
    assert match_key("beta", keys) == "beta" and match_key("bet", keys) is None and match_key(None, keys) is None
    assert match_key("\udc80", keys) is None  # not encodable as UTF-8: no crash
    acc = AccessConfig(keys)
    assert acc.requires_key("/v1/models") and acc.requires_key("/tokenize") and not acc.requires_key("/health")
    assert not acc.requires_key("/metrics") and AccessConfig(keys, True).requires_key("/metrics")
    assert not AccessConfig([]).requires_key("/v1/models")


# ---- rate limits and admission (unit, fake clock) ----

class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_token_bucket_and_rate_limiter():
    clock = Clock()
    b = TokenBucket(60, 60.0, clock)
    assert b.take(60) == 0 and b.take(1) == pytest.approx(1.0)
    clock.t += 0.5
    assert b.take(1) == pytest.approx(0.5)
    clock.t += 0.5
    assert b.take(1) == 0
    rl = RateLimiter(rpm=2, tpm=100, clock=clock)
    rl.check_request("a")
    rl.check_request("a")
    with pytest.raises(OpenAIError) as ei:
        rl.check_request("a")
    e = ei.value
    assert e.status == 429 and e.type == "rate_limit_error" and int(e.headers["Retry-After"]) == 30
    rl.check_request("b")  # per key
    rl.check_tokens("a", 80)
    with pytest.raises(OpenAIError) as ei:
        rl.check_tokens("a", 30)
    assert ei.value.status == 429 and int(ei.value.headers["Retry-After"]) == 6  # 10 tokens at 100/60 per s
    with pytest.raises(OpenAIError) as ei:
        rl.check_tokens("c", 101)  # can never fit
    assert ei.value.code == "tokens_exceeded"
    clock.t += 30
    rl.check_request("a")


def test_admission_queue():
    clock = Clock()
    q = AdmissionQueue(lambda: 4, max_waiting=2, max_queue_wait=10.0, clock=clock)
    tickets = [q.admit(1) for _ in range(6)]  # 4 run, 2 wait
    with pytest.raises(OpenAIError) as ei:
        q.admit(1)
    assert ei.value.status == 429 and ei.value.code == "server_overloaded" and "Retry-After" in ei.value.headers
    assert q.estimate(1).queued == 2 and q.estimate(1).wait is None  # no finish measured yet
    # measured: 1 sequence finishes per second
    for t in tickets[:3]:
        clock.t += 1.0
        t.release()
    assert q.finish_rate() == pytest.approx(1.5)  # 3 in the 2 s since the first finish
    tickets = tickets[3:] + [q.admit(1) for _ in range(3)]  # in system: 6 (4 run, 2 wait)
    # 3 sequences ahead beyond the 4 running: one full service time, 4 / 1.5 s (conservative, see admission.py)
    assert q.estimate(1).wait == pytest.approx(4 / 1.5)
    q.max_waiting = 100
    q.max_queue_wait = 3.0
    tickets += [q.admit(1), q.admit(1)]  # 3 and 4 ahead: 2.67 s, admitted
    assert q.estimate(1).wait == pytest.approx(8 / 1.5)
    with pytest.raises(OpenAIError) as ei:
        q.admit(1)  # 5 ahead: two service times, 5.33 s > 3
    assert ei.value.status == 429 and int(ei.value.headers["Retry-After"]) >= 1
    n = q.in_system
    tickets[0].release()
    tickets[0].release()  # idempotent
    assert q.in_system == n - 1
    del tickets
    gc.collect()
    assert q.in_system == 0  # a ticket nobody released is released when collected


# ---- end to end ----

KEYS = ("key-one", "key-two")


def _h(key=KEYS[0]) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def hard(tmp_path_factory):
    kf = tmp_path_factory.mktemp("keys") / "keys.txt"
    kf.write_text("key-file\n")
    os.environ["PYSERVE_API_KEY"] = "key-env"
    try:
        s = Server("--api-key", KEYS[0], "--api-key", KEYS[1], "--api-key-file", str(kf), "--allowed-origins",
                   "http://ok.example", "--max-body-size", "64K", "--keep-alive-timeout", "2", "--body-timeout", "2")
    finally:
        del os.environ["PYSERVE_API_KEY"]
    s.wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)


def test_auth(hard):
    u = hard.url
    assert httpx.get(u + "/health").status_code == 200
    assert httpx.get(u + "/metrics").status_code == 200  # open without --metrics-require-key
    assert httpx.get(u + "/openapi.json").status_code == 200
    before = httpx.get(u + "/server_info", headers=_h()).json()["auth_failures"]
    secret = "sk-WRONG-do-not-log-1234"
    for path, method in [("/v1/models", "GET"), ("/v1/completions", "POST"), ("/v1/chat/completions", "POST"),
                         ("/tokenize", "POST"), ("/detokenize", "POST"), ("/apply-template", "POST"),
                         ("/server_info", "GET")]:
        for headers in ({}, {"Authorization": f"Bearer {secret}"}, {"Authorization": f"Basic {KEYS[0]}"},
                        {"Authorization": "Bearer"}):
            r = httpx.request(method, u + path, headers=headers, json={"prompt": "x"})
            assert r.status_code == 401, (path, headers, r.text)
            e = r.json()["error"]
            assert e["code"] == "invalid_api_key" and e["type"] == "invalid_request_error"
            assert r.headers["www-authenticate"].startswith("Bearer")
    after = httpx.get(u + "/server_info", headers=_h()).json()["auth_failures"]
    assert after - before == 28
    samples, _ = parse_metrics(httpx.get(u + "/metrics").text)
    assert ("pyserve:auth_failures_total", (("model_name", MODEL),)) in samples
    assert total(samples, "pyserve:auth_failures_total") == after
    for key in (*KEYS, "key-file", "key-env"):
        r = httpx.get(u + "/v1/models", headers=_h(key))
        assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL, key
    r = httpx.post(u + "/v1/completions", headers=_h(KEYS[1]), json={"prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200
    # The server logs a minute's first ten 401s, the tenth saying so: once the test's reader thread has that
    # line, it has every line the 28 refusals logged.
    deadline = time.monotonic() + 10
    while not any("further 401s this minute are not logged" in line for line in hard.stderr):
        assert time.monotonic() < deadline, "".join(hard.stderr)
        time.sleep(0.01)
    assert not any(secret in line for line in hard.stderr)  # never logged
    assert any("401" in line for line in hard.stderr)


def test_cors(hard, server):
    u = hard.url
    pre = {"Origin": "http://ok.example", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(u + "/v1/chat/completions", headers=pre)  # no key on a preflight
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "http://ok.example"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    r = httpx.options(u + "/v1/chat/completions", headers=dict(pre, Origin="http://evil.example"))
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    r = httpx.get(u + "/v1/models", headers=dict(_h(), Origin="http://ok.example"))
    assert r.headers["access-control-allow-origin"] == "http://ok.example"
    r = httpx.get(u + "/v1/models", headers=dict(_h(), Origin="http://evil.example"))
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    # off by default
    r = httpx.get(server.url + "/v1/models", headers={"Origin": "http://ok.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    r = httpx.options(server.url + "/v1/models", headers=dict(pre, Origin="http://ok.example"))
    assert "access-control-allow-origin" not in r.headers


@pytest.fixture(scope="module")
def server():
    s = Server().wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)


def _err(r, status, param=None, code=None):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    if param is not None:
        assert e["param"] == param, e
    if code is not None:
        assert e["code"] == code, e
    return e


def test_bad_input_http(hard):
    u = hard.url
    post = lambda path, content, ctype="application/json", **kw: httpx.post(  # noqa: E731
        u + path, content=content, headers=dict(_h(), **({"Content-Type": ctype} if ctype else {})), **kw)
    _err(post("/v1/completions", b'{"prompt": "\xff\xfe"}'), 400)
    _err(post("/v1/completions", b'{"prompt": "x", "temperature": NaN}'), 400)
    _err(post("/v1/completions", b'{"prompt": "\\udfff"}'), 400)
    _err(post("/v1/completions", b"[" * 50000), 400)
    _err(post("/v1/completions", b""), 400)
    _err(post("/v1/completions", b"[1, 2]"), 400)
    _err(post("/v1/completions", b'{"prompt": "x"}', "text/plain"), 415, code="unsupported_media_type")
    _err(post("/v1/completions", b"prompt=x", "application/x-www-form-urlencoded"), 415)
    assert post("/v1/completions", b'{"prompt": "x", "max_tokens": 1}', None).status_code == 200  # no type: JSON
    big = json.dumps({"prompt": "x" * (70 * 1024)}).encode()
    _err(post("/v1/completions", big), 413, code="request_too_large")

    def chunks():
        for _ in range(70):
            yield b" " * 1024

    _err(post("/v1/completions", chunks()), 413)  # chunked, no Content-Length
    j = lambda path, body: httpx.post(u + path, json=body, headers=_h())  # noqa: E731
    _err(j("/v1/completions", {"prompt": "x", "logit_bias": {"999999999": 5}}), 400, param="logit_bias")
    _err(j("/v1/completions", {"prompt": "x", "stop_token_ids": [10 ** 9]}), 400, param="stop_token_ids")
    _err(j("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}), 400, param="messages[0].role")
    _err(j("/v1/chat/completions", {"messages": CHAT, "temperature": 3}), 400, param="temperature")
    _err(j("/v1/chat/completions", {"messages": CHAT, "n": 100}), 400, param="n")
    e = _err(j("/v1/completions", {"prompt": "hello " * 9000}), 400, code="context_length_exceeded")
    assert "8192" in e["message"] and "prompt" in e["message"]
    e = _err(j("/v1/chat/completions", {"messages": CHAT, "max_tokens": 8190}), 400, code="context_length_exceeded")
    assert "8192" in e["message"] and "8190" in e["message"]
    _err(j("/tokenize", {"prompt": 5}), 400, param="prompt")
    _err(j("/tokenize", {"prompt": "x", "add_special_tokens": "no"}), 400, param="add_special_tokens")
    _err(j("/tokenize", {"messages": [{"role": "x", "content": "y"}]}), 400, param="messages[0].role")
    _err(j("/detokenize", {"tokens": [-1]}), 400, param="tokens")
    _err(j("/detokenize", {"tokens": "abc"}), 400, param="tokens")
    _err(j("/apply-template", {"messages": []}), 400, param="messages")
    _err(j("/apply-template", {"messages": CHAT, "chat_template_kwargs": {"add_generation_prompt": 1,
                                                                          "bad name": 2}}), 400)
    _err(httpx.put(u + "/v1/completions", headers=_h()), 405)
    _err(httpx.get(u + "/v1/nowhere", headers=_h()), 404)


def test_huge_prompt_refused_fast(server):
    """Megabytes are refused without tokenizing them (that would block the event loop for seconds)."""
    u = server.url
    t0 = time.monotonic()
    e = _err(httpx.post(u + "/v1/completions", json={"prompt": "hello world, " * 400000}, timeout=30), 400,
             param="prompt", code="context_length_exceeded")
    assert "at least" in e["message"]
    e = _err(httpx.post(u + "/v1/chat/completions", timeout=30,
                        json={"messages": [{"role": "user", "content": "ab " * 400000}]}), 400,
             param="messages", code="context_length_exceeded")
    _err(httpx.post(u + "/tokenize", json={"prompt": "x" * 7_000_000}, timeout=30), 400,
         code="context_length_exceeded")
    assert time.monotonic() - t0 < 3


def _raw(port: int, data: bytes, wait: float = 10.0) -> tuple[bytes, float]:
    """Sends `data`, reads until the server closes; (what came back, seconds it took)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=wait)
    t0 = time.monotonic()
    s.sendall(data)
    got = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
    return got, time.monotonic() - t0


def test_slow_and_half_open_connections(hard):
    port = hard.port
    # idle after connecting: closed after the keep-alive timeout (2 s)
    got, dt = _raw(port, b"")
    assert got == b"" and dt < 5, dt
    # headers never finished
    got, dt = _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n")
    assert dt < 5 and (got == b"" or b" 408 " in got.split(b"\r\n")[0]), got
    # body never finished: 408 after the body timeout (2 s), not a 5xx
    hdr = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEYS[0]}\r\n"
           f"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n").encode()
    got, dt = _raw(port, hdr + b'{"prompt"')
    status = got.split(b"\r\n", 1)[0]
    assert dt < 6 and (got == b"" or b" 408 " in status), got[:200]
    # garbage request line: 400, connection closed
    got, dt = _raw(port, b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
    assert dt < 5 and (got == b"" or got.split(b"\r\n")[0].split()[1][:1] == b"4"), got[:100]
    # big headers: never a 5xx
    got, dt = _raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n")
    assert got == b"" or got.split(b"\r\n")[0].split()[1][:1] in (b"2", b"4"), got[:100]
    # the server still answers
    assert httpx.get(hard.url + "/health").status_code == 200
    assert not any("Traceback" in line for line in hard.stderr), "".join(hard.stderr)


# ---- rate limits and admission (own server) ----

@pytest.fixture(scope="module")
def limited():
    s = Server("--api-key", "a", "--api-key", "b", "--api-key", "c", "--metrics-require-key",
               "--rate-limit-rpm", "4", "--rate-limit-tpm", "400", "--max-num-seqs", "2", "--max-waiting", "1")
    s.wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)


def test_metrics_require_key(limited):
    assert httpx.get(limited.url + "/metrics").status_code == 401
    assert httpx.get(limited.url + "/metrics", headers=_h("a")).status_code == 200
    assert httpx.get(limited.url + "/health").status_code == 200


def test_rate_limits(limited):
    u = limited.url
    ok = [httpx.post(u + "/v1/completions", headers=_h("a"), json={"prompt": "Hi", "max_tokens": 1})
          for _ in range(4)]
    assert all(r.status_code == 200 for r in ok), [r.text for r in ok]
    r = httpx.post(u + "/v1/completions", headers=_h("a"), json={"prompt": "Hi", "max_tokens": 1})
    e = _err(r, 429)
    assert e["type"] == "rate_limit_error" and 1 <= int(r.headers["retry-after"]) <= 15
    # tokens per minute: key b (its own buckets); 300 + prompt fits once, not twice
    with httpx.stream("POST", u + "/v1/completions", headers=_h("b"), timeout=60,
                      json={"prompt": "Hi", "max_tokens": 300, "stream": True}) as r:
        assert r.status_code == 200  # admitted (300 + prompt tokens taken); closed at once: the request aborts
    r = httpx.post(u + "/v1/completions", headers=_h("b"), json={"prompt": "Hi", "max_tokens": 300})
    e = _err(r, 429, code="tokens_exceeded")
    assert e["type"] == "rate_limit_error" and int(r.headers["retry-after"]) >= 10
    r = httpx.post(u + "/v1/completions", headers=_h("b"), json={"prompt": "Hi", "max_tokens": 1000})
    _err(r, 429, code="tokens_exceeded")  # over the whole minute's allowance


def test_queue_admission(limited):
    """max_num_seqs 2 + max_waiting 1: with 3 long requests in the system (2 running, 1 waiting), a 4th is
    refused at once."""
    u = limited.url
    results: list = []

    async def main():
        async with httpx.AsyncClient(base_url=u, timeout=60, headers=_h("c")) as http:
            async def one(i):
                t0 = time.monotonic()
                r = await http.post("/v1/completions", json={"prompt": f"Count to {i}", "max_tokens": 60,
                                                             "ignore_eos": True, "temperature": 0})
                results.append((r.status_code, time.monotonic() - t0, r.headers.get("retry-after"), r.json()))

            async with trio.open_nursery() as n:
                for i in range(3):
                    n.start_soon(one, i)
                # the 4th once the server has admitted the first three (60 tokens each: they are still there)
                with trio.fail_after(30):
                    while (await http.get("/server_info")).json()["admission"]["in_system"] < 3:
                        await trio.sleep(0.01)
                n.start_soon(one, 3)

    trio.run(main)
    codes = sorted(r[0] for r in results)
    assert codes == [200, 200, 200, 429], results
    refused = next(r for r in results if r[0] == 429)
    assert refused[3]["error"]["code"] == "server_overloaded" and int(refused[2]) >= 1
    assert refused[1] < min(r[1] for r in results if r[0] == 200)  # refused at once
    info = httpx.get(u + "/server_info", headers=_h("a")).json()
    assert info["admission"]["refused"] >= 1 and info["admission"]["in_system"] == 0
