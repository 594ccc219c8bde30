"""The HTTP server end to end: a real `pyserve serve` process on a loopback port, the default model, real clients
(the official openai SDK, sync and async; httpx; curl; raw sockets)."""
from __future__ import annotations

import asyncio
import json
import shutil
import signal
import socket
import subprocess
import time

import httpx
import openai
import pytest
import trio

from support.live_server import CHAT, MODEL, Server, metric_totals, raw_completion, sse_events, stats


# ---- basics ----

def test_a_server_that_cannot_start_fails_fast():
    srv = Server("--model", "/nonexistent/model.gguf")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="stdout closed before the ready line") as ei:
        srv.wait_ready(timeout=60)
    assert time.monotonic() - t0 < 30 and srv.returncode == 2  # the CLI's usage-error status
    assert "model file not found: /nonexistent/model.gguf" in str(ei.value)  # the server's stderr comes along


def test_health_models(server, client):
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_completions_sync_sdk(client):
    full = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0)
    assert full.object == "text_completion" and len(full.choices) == 1
    c = full.choices[0]
    assert c.finish_reason == "length" and c.text
    assert full.usage.completion_tokens == 12 and full.usage.total_tokens == full.usage.prompt_tokens + 12
    assert full.usage.prompt_tokens_details.cached_tokens == 0
    chunks = list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12,
                                            temperature=0, stream=True))
    assert {ch.id for ch in chunks} == {chunks[0].id} and chunks[0].id.startswith("cmpl-")
    assert "".join(ch.choices[0].text for ch in chunks) == c.text  # greedy: the same text streamed or not
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(ch.choices[0].finish_reason is None for ch in chunks[:-1])


def test_chat_sync_sdk(client):
    full = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=10, temperature=0)
    assert full.object == "chat.completion" and full.id.startswith("chatcmpl-")
    msg = full.choices[0].message
    assert msg.role == "assistant" and msg.content and full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 10
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert len({(c.id, c.created, c.model) for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == msg.content
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_async_sdk(server):
    async def main():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        full = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
        stream = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0,
                                                      stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        comp = await client.completions.create(model=MODEL, prompt=[1, 2, 3][:0] or "Once upon a time",
                                               max_tokens=6, temperature=0, stream=True)
        ctext = "".join([c.choices[0].text async for c in comp])
        await client.close()
        return full.choices[0].message.content, text, ctext

    full, text, ctext = asyncio.run(main())
    assert full == text and ctext


def test_sse_wire_format(server):
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 5, "temperature": 0, "stream": True, "n": 2, "seed": 7,
            "stream_options": {"include_usage": True}}
    r = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    ev = sse_events(r.text)
    assert ev[-1] == "[DONE]" and "[DONE]" not in ev[:-1]
    chunks = ev[:-1]
    assert len({(c["id"], c["created"], c["model"], c["object"]) for c in chunks}) == 1
    assert chunks[0]["object"] == "chat.completion.chunk"
    *body_chunks, usage = chunks
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10
    assert set(usage["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}
    for idx in (0, 1):
        mine = [c["choices"][0] for c in body_chunks if c["choices"][0]["index"] == idx]
        assert all(len(c["choices"]) == 1 and "usage" in c and c["usage"] is None for c in body_chunks)
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert mine[-1]["finish_reason"] == "length" and mine[-1]["delta"] == {}
        assert all(m["finish_reason"] is None and set(m["delta"]) == {"content"} for m in mine[1:-1])
    # without include_usage: no usage key at all
    body.pop("stream_options")
    ev = sse_events(httpx.post(server.url + "/v1/completions", json=dict(body, prompt="Hi", messages=None)).text)
    assert ev[-1] == "[DONE]" and all("usage" not in c for c in ev[:-1])
    assert {c["choices"][0]["index"] for c in ev[:-1]} == {0, 1}


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
def test_curl_stream(server):
    out = subprocess.run(["curl", "-sN", server.url + "/v1/completions", "-H", "Content-Type: application/json",
                          "-d", json.dumps({"prompt": "Hello", "max_tokens": 4, "stream": True})],
                         capture_output=True, text=True, timeout=30)
    ev = sse_events(out.stdout)
    assert ev[-1] == "[DONE]" and ev[-2]["choices"][0]["finish_reason"] in ("stop", "length")


def test_fields(client):
    # n with a seed, several prompts, stop strings, logit_bias, logprobs
    r = client.completions.create(model=MODEL, prompt=["One, two,", "Hello"], n=2, seed=1, max_tokens=4,
                                  temperature=1.0, logprobs=2)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) <= 3 for t in lp.top_logprobs)  # the top 2 and the sampled token (OpenAI: logprobs + 1)
    again = client.completions.create(model=MODEL, prompt=["One, two,", "Hello"], n=2, seed=1, max_tokens=4,
                                      temperature=1.0)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]  # seed + i per choice: reproducible
    r = client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=20, temperature=0, stop=[" six"])
    assert r.choices[0].finish_reason == "stop" and " six" not in r.choices[0].text
    r = client.completions.create(model=MODEL, prompt=[[2, 818, 5279, 529, 7001, 563]], max_tokens=3, temperature=0,
                                  echo=True)
    assert r.choices[0].text.startswith("The capital of France is")
    banned = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=1, temperature=0)
    tid = httpx.post(str(client.base_url).replace("/v1/", "/tokenize"),
                     json={"prompt": banned.choices[0].text, "add_special_tokens": False}).json()["tokens"][0]
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=1, temperature=0,
                                  logit_bias={str(tid): -100})
    assert r.choices[0].text != banned.choices[0].text
    c = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, logprobs=True, top_logprobs=3,
                                       temperature=0, extra_body={"top_k": 5, "min_p": 0.01, "repetition_penalty": 1.1,
                                                                  "some_unknown_field": 1})
    content = c.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 3 for t in content)
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, logprobs=True,
                                                 top_logprobs=2, temperature=0, stream=True))
    streamed = [t for ch in chunks if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content])
    two = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, n=2, seed=5, user="u1")
    assert sorted(c.index for c in two.choices) == [0, 1] and two.usage.completion_tokens == 8


# ---- errors ----

def test_errors(server, client):
    def err(path, body, status, code=None, param=None):
        r = httpx.post(server.url + path, content=body if isinstance(body, bytes) else json.dumps(body),
                       headers={"Content-Type": "application/json"})
        assert r.status_code == status, r.text
        e = r.json()["error"]
        assert set(e) == {"message", "type", "param", "code"} and e["message"]
        if code:
            assert e["code"] == code, e
        if param:
            assert e["param"] == param, e
        return e

    err("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, param="temperature")
    err("/v1/completions", {"prompt": "x", "top_p": 0}, 400, param="top_p")
    err("/v1/completions", {"max_tokens": 3}, 400, param="prompt")
    err("/v1/completions", b"{not json", 400)
    err("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, code="model_not_found")
    err("/v1/completions", {"prompt": "x", "max_tokens": 9000}, 400, code="context_length_exceeded")
    huge = 43746783618  # past an int32: refused like any bound past the context, not a 500
    for path, body in [("/v1/completions", {"prompt": "x", "max_tokens": huge}),
                       ("/v1/chat/completions", {"messages": CHAT, "max_tokens": huge}),
                       ("/v1/responses", {"input": "x", "max_output_tokens": huge})]:
        err(path, body, 400, code="context_length_exceeded")
    err("/v1/completions", {"prompt": [5, 999999999]}, 400, param="prompt")
    err("/v1/chat/completions", {"messages": CHAT, "tool_choice": "required"}, 400, param="tool_choice")
    err("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_xml"}}, 400,
        param="response_format")
    err("/v1/chat/completions", {"messages": CHAT, "stream_options": {"include_usage": True}}, 400)
    e = err("/v1/chat/completions", {"messages": [{"role": "assistant", "content": "hi"}]}, 400)
    assert "alternate" in e["message"]  # the template's raise_exception message
    err("/v1/chat/completions", {"messages": CHAT, "chat_template": "{% if %}"}, 400, param="chat_template")
    r = httpx.get(server.url + "/v1/nowhere")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=CHAT)
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=100000, stream=True)
    assert ei.value.code == "context_length_exceeded"


# ---- the other endpoints ----

def test_tokenize_template_info(server):
    u = server.url
    toks = httpx.post(u + "/tokenize", json={"prompt": "Hello world"}).json()
    assert toks["tokens"][0] == 2 and toks["count"] == len(toks["tokens"]) and toks["max_model_len"] == 8192
    assert httpx.post(u + "/detokenize", json={"tokens": toks["tokens"]}).json()["prompt"] == "<bos>Hello world"
    prompt = httpx.post(u + "/apply-template", json={"messages": CHAT}).json()["prompt"]
    assert prompt.startswith("<bos><start_of_turn>user\n") and prompt.endswith("<start_of_turn>model\n")
    ids = httpx.post(u + "/tokenize", json={"messages": CHAT}).json()["tokens"]
    assert ids[0] == 2 and ids[1] != 2  # no doubled BOS
    # a template sent with the request is refused unless the server trusts them (see the next server's test)
    r = httpx.post(u + "/apply-template", json={"messages": CHAT, "chat_template": "{{ messages[0].content }}!",
                                                "add_generation_prompt": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template"
    assert r.json()["error"]["code"] == "chat_template_not_allowed"
    info = httpx.get(u + "/server_info").json()
    assert info["model"] == MODEL and info["ready"] and "stats" in info
    # the keys sglang-router reads: the name it lists and routes by, the file kept under model_path
    assert info["served_model_name"] == MODEL and info["model_path"].endswith(".gguf")
    mi = httpx.get(u + "/model_info").json()
    assert mi["hparams"]["arch"] == "gemma3" and "tokenizer.ggml.tokens" not in mi["metadata"]
    r = httpx.get(u + "/metrics")
    assert r.status_code == 200 and "pyserve:kv_blocks_used" in r.text and "pyserve:request_success" in r.text


# ---- cancellation ----

def test_drop_streams_frees_blocks(server, client):
    """Eight streams at once; once the server runs all eight, the clients of the four long ones hang up: the
    engine aborts those (their blocks freed) while the other four run on to the text they give alone."""
    prompts = [f"Count slowly from {i} to one hundred:" for i in range(8)]
    # the survivors are long enough (96 tokens) that none can finish between the drops and the next scrape
    ref = {i: client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=96, temperature=0,
                                        extra_body={"ignore_eos": True}).choices[0].text for i in (1, 3, 5, 7)}
    result: dict = {}
    seen: dict = {}
    peak = [0.0]  # kv blocks in use, the most any scrape saw

    async def main():
        drop = trio.Event()
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            async def one(i: int, dropped: bool):
                body = {"prompt": prompts[i], "max_tokens": 2000 if dropped else 96, "temperature": 0,
                        "stream": True, "ignore_eos": True}
                text, n = "", 0
                async with http.stream("POST", "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        text += json.loads(line[6:])["choices"][0]["text"]
                        n += 1
                        if dropped and n == 5:
                            await drop.wait()
                            break  # leaving the block closes the connection mid-stream
                result[i] = text

            async def poll(cond) -> dict:
                """The first scrape of /metrics (bounded: 30 s) for which `cond(stats)` holds."""
                with trio.fail_after(30):
                    while True:
                        st = metric_totals((await http.get("/metrics")).text)
                        peak[0] = max(peak[0], st["kv_blocks_used"])
                        if cond(st):
                            return st
                        await trio.sleep(0.005)

            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(one, i, i % 2 == 0)
                seen["all"] = await poll(lambda st: st["num_requests_running"] == 8)
                drop.set()
                seen["after"] = await poll(lambda st: st["num_requests_running"] <= 4)

    before = stats(server)
    assert before["kv_blocks_used"] == 0
    trio.run(main)
    for i in (1, 3, 5, 7):
        assert result[i] == ref[i], i
    # after the drops, only the survivors hold blocks (none has finished yet): the engine frees an aborted
    # sequence's blocks in the step that removes it, so 4 running means the other 4 hold none; a survivor
    # may cross a block boundary between two scrapes, so the count is at most the peak, not below it
    after = seen["after"]
    assert after["num_requests_running"] == 4 and 0 < after["kv_blocks_used"] <= peak[0], (seen, peak)
    assert after["request_success_total"] == before["request_success_total"], seen
    t0 = time.monotonic()
    while stats(server)["kv_blocks_used"] and time.monotonic() - t0 < 5:
        time.sleep(0.02)
    end = stats(server)
    assert end["kv_blocks_used"] == 0 and end["num_requests_running"] == 0
    assert end["request_aborted_total"] - before["request_aborted_total"] == 4


def test_disconnect_aborts_quickly(server):
    s = raw_completion(server, 4000, stream=True, events=4)
    assert stats(server)["kv_blocks_used"] > 0
    s.close()
    t0 = time.monotonic()
    while stats(server)["kv_blocks_used"] and time.monotonic() - t0 < 5:
        time.sleep(0.005)
    dt = time.monotonic() - t0
    assert stats(server)["kv_blocks_used"] == 0
    print(f"blocks freed {dt * 1000:.1f} ms after the disconnect")
    assert dt < 0.5, f"blocks freed {dt * 1000:.0f} ms after the disconnect"


@pytest.mark.parametrize("request_line,headers", [("HTTP/1.0", ""), ("HTTP/1.1", "Connection: close\r\n")])
@pytest.mark.parametrize("stream", [False, True])
def test_connection_close(server, request_line, headers, stream):
    body = json.dumps({"prompt": "Hi", "max_tokens": 3, "stream": stream}).encode()
    s = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    s.sendall(f"POST /v1/completions {request_line}\r\nHost: x\r\nContent-Type: application/json\r\n{headers}"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    data = b""
    while True:
        chunk = s.recv(65536)  # a timeout here: the server never closed the connection
        if not chunk:
            break
        data += chunk
    s.close()
    assert data.split(b"\r\n", 1)[0].split()[1] == b"200"
    if stream:
        assert b"data: [DONE]\n\n" in data
        assert data.endswith(b"data: [DONE]\n\n" if request_line == "HTTP/1.0" else b"\r\n0\r\n\r\n")
    else:
        assert json.loads(data.split(b"\r\n\r\n", 1)[1])["choices"][0]["text"] is not None


# ---- shutdown (own server: --api-key, short drain) ----

def test_api_key_template_file_and_drain(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("[{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}]")
    srv = Server("--api-key", "sekrit", "--drain-timeout", "1", "--chat-template", str(template),
                 "--served-model-name", "tiny", "--trust-request-chat-template")
    try:
        # it listens while the model loads: /health says 503 until the model is ready
        assert srv.listening.wait(60)
        # (a warm load takes ~0.1 s: a 200 only means it finished before the request; either may see it end)
        r = httpx.get(srv.listen_url + "/health")
        assert r.status_code in (503, 200)
        if r.status_code == 503:
            assert r.json() == {"status": "loading"}
        r = httpx.get(srv.listen_url + "/v1/models", headers={"Authorization": "Bearer sekrit"})
        assert r.status_code in (503, 200)
        if r.status_code == 503:
            assert "still loading" in r.json()["error"]["message"] and r.headers["retry-after"] == "5"
        srv.wait_ready()
        assert httpx.get(srv.url + "/health").status_code == 200
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(srv.url + "/health").status_code == 200
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="sekrit", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices[0].text is not None
        r = httpx.post(srv.url + "/apply-template", headers={"Authorization": "Bearer sekrit"},
                       json={"messages": [{"role": "user", "content": "hey"}]})
        assert r.json() == {"prompt": "[user:hey;]"}  # --chat-template FILE over the built-in gemma template
        custom = httpx.post(srv.url + "/apply-template", headers={"Authorization": "Bearer sekrit"},
                            json={"messages": CHAT, "chat_template": "{{ messages[0].content }}!",
                                  "add_generation_prompt": False}).json()
        assert custom["prompt"] == CHAT[0]["content"] + "!"  # with --trust-request-chat-template
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=30,
                          headers={"Authorization": "Bearer sekrit"},
                          json={"prompt": "Tell a story", "max_tokens": 4000, "ignore_eos": True,
                                "stream": True}) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["choices"]
            srv.proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            rest = [line for line in lines if line.startswith("data: ")]
        assert time.monotonic() - t0 < 10
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["error"]["message"] == "server shutting down"
        assert srv.proc.wait(15) == 0, "".join(srv.stderr)
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
