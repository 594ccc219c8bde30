"""Streams that live through long prefills and queues: SSE keep-alive comments (--sse-keepalive), llama.cpp's
return_progress, Anthropic's message_start usage once the prompt is admitted, a prefill cancelled by a
disconnect, and `priority` over HTTP. A real server on loopback; waits are on events (a line, a metric)."""
import json
import random
import socket

import anthropic
import httpx
import openai
import pytest

from support.live_server import MODEL, Server, poll, stats


@pytest.fixture(scope="module")
def server():
    s = Server("--sse-keepalive", "0.05", "--max-num-seqs", "1").wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-3000:]


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(n))


def bare_stream(server, body: dict, until: bytes) -> tuple[socket.socket, bytes]:
    """A streamed completion POSTed over a bare socket (closing it is a disconnect), returned with what arrived
    once `until` did."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(data)).encode() + b"\r\n\r\n" + data)
    got = b""
    while until not in got:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    return s, got


def hold_the_seat(server) -> socket.socket:
    """A long greedy completion (max_num_seqs 1: it holds the only seat), once its first token arrived."""
    body = {"prompt": "Once", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    return bare_stream(server, body, b'"text"')[0]


def test_a_queued_stream_gets_keep_alive_comments_then_its_tokens(server):
    holder = hold_the_seat(server)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
            "stream": True, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        first = next(lines)
        assert json.loads(first[len("data: "):])["choices"][0]["delta"]["role"] == "assistant"
        assert next(lines) == ""
        assert next(lines) == ": keep-alive"  # queued behind the holder: nothing else can come
        holder.close()
        rest = [line for line in lines if line]
    data = [line for line in rest if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]" and all(line in ("data: [DONE]", ": keep-alive") or line.startswith("data: {")
                                              for line in rest)
    plain = httpx.post(server.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=60).json()
    text = "".join(json.loads(d[6:])["choices"][0]["delta"].get("content") or "" for d in data[:-1]
                   if json.loads(d[6:])["choices"])
    assert text == plain["choices"][0]["message"]["content"] and text


def test_the_openai_sdk_reads_a_stream_with_keep_alives(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    holder = hold_the_seat(server)
    stream = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=6, temperature=0, stream=True)
    chunks = iter(stream)
    holder.close()  # the stream's keep-alives so far were skipped by the SDK's SSE parser
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    plain = client.completions.create(model=MODEL, prompt="The sea is", max_tokens=6, temperature=0)
    assert text == plain.choices[0].text and text


def progress_stream(server, prompt: str, path: str = "/v1/completions") -> list[dict]:
    body = {"model": MODEL, "max_tokens": 2, "temperature": 0, "stream": True, "return_progress": True,
            "stream_options": {"include_usage": True}}
    body |= {"prompt": prompt} if path == "/v1/completions" else {"messages": [{"role": "user", "content": prompt}]}
    with httpx.stream("POST", server.url + path, json=body, timeout=120) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_return_progress_reports_the_prefill_chunk_by_chunk(server):
    prompt = words(500, 1)  # ~1,900 tokens: four chunks of 512
    chunks = progress_stream(server, prompt)
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    total = chunks[-1]["usage"]["prompt_tokens"]
    assert len(progress) == -(-total // 512) and all(p["total"] == total and p["cache"] == 0 for p in progress)
    assert [p["processed"] for p in progress] == [min(512 * (i + 1), total) for i in range(len(progress))]
    assert all(a["time_ms"] <= b["time_ms"] for a, b in zip(progress, progress[1:]))
    first_text = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["text"])
    assert all("prompt_progress" in c for c in chunks[:first_text]) and first_text == len(progress)
    again = progress_stream(server, prompt)
    cached = again[-1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    p = [c["prompt_progress"] for c in again if "prompt_progress" in c]
    assert cached > 0 and p == [{**p[0], "total": total, "cache": cached, "processed": total}]


def test_return_progress_on_chat_and_not_without_it(server):
    chunks = progress_stream(server, words(200, 2), "/v1/chat/completions")
    progress = [c for c in chunks if "prompt_progress" in c]
    assert progress and all(c["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}]
                            for c in progress)
    assert progress[-1]["prompt_progress"]["processed"] == chunks[-1]["usage"]["prompt_tokens"]
    body = {"model": MODEL, "prompt": words(200, 3), "max_tokens": 2, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        assert not any("prompt_progress" in line for line in r.iter_lines())
    r = httpx.post(server.url + "/v1/completions", json={**body, "stream": False, "return_progress": True})
    assert r.status_code == 200 and "prompt_progress" not in r.json()


def test_anthropic_message_start_carries_the_prompt_usage(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    kw = dict(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": words(300, 4)}])
    n_prompt = client.messages.count_tokens(model=MODEL, messages=kw["messages"]).input_tokens
    starts, ends = [], []
    for _ in range(2):
        with client.messages.stream(**kw) as s:
            events = list(s)
        starts.append(next(e for e in events if e.type == "message_start").message.usage)
        ends.append(s.get_final_message().usage)
    assert (starts[0].input_tokens, starts[0].cache_read_input_tokens) == (n_prompt, 0)
    assert starts[1].cache_read_input_tokens > 0
    assert starts[1].input_tokens + starts[1].cache_read_input_tokens == n_prompt
    assert [(u.input_tokens, u.cache_read_input_tokens) for u in starts] == \
        [(u.input_tokens, u.cache_read_input_tokens) for u in ends]


def test_a_disconnect_during_a_long_prefill_frees_its_blocks_at_once(server):
    body = {"model": MODEL, "prompt": words(1000, 5), "max_tokens": 2, "stream": True,
            "return_progress": True}  # ~6,000 tokens: a dozen chunks of 512
    sock, got = bare_stream(server, body, b"prompt_progress")
    total = json.loads(got.split(b"data: ")[-1].split(b"\n")[0])["prompt_progress"]["total"]
    assert total > 4096, total
    before = stats(server)
    sock.close()
    after = poll(lambda: (s := stats(server))["num_requests_running"] == 0 and s, what="the abort")
    assert after["kv_blocks_used"] == 0
    assert after["engine_steps_total"] - before["engine_steps_total"] <= 2
    assert after["tokens_computed_total"] - before["tokens_computed_total"] < total - 1024


def test_a_better_priority_overtakes_a_running_stream(server):
    """max_num_seqs 1: a priority-0 request preempts the running priority-5 stream, ends first, and the stream
    then resumes and ends with what it would have said alone."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    kw = dict(model=MODEL, prompt="A story:", max_tokens=200, temperature=0)  # long enough to be overtaken
    alone = client.completions.create(**kw, extra_body={"ignore_eos": True}).choices[0].text
    low = iter(client.completions.create(**kw, stream=True, extra_body={"ignore_eos": True, "priority": 5}))
    text = next(low).choices[0].text
    preempted = stats(server)["num_preemptions_total"]
    high = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, extra_body={"priority": 0})
    assert high.choices[0].finish_reason == "length" and stats(server)["num_preemptions_total"] == preempted + 1
    text += "".join(c.choices[0].text for c in low if c.choices)
    assert text == alone


@pytest.mark.parametrize("field,value", [("priority", "high"), ("priority", 2**40), ("priority", 1.5),
                                         ("cache_salt", ""), ("cache_salt", 7), ("return_progress", "yes")])
def test_bad_placement_fields_are_400s_naming_them(server, field, value):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
