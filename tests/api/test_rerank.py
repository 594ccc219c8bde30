"""/v1/rerank, /rerank and /v1/score against a real server holding two random-weight qwen3 rerankers
(model_factory: a Qwen3-Reranker-like two-row "yes"/"no" head with a rerank template, and a one-row head with
a bias and no template) beside the default model: the scores are the NumPy reference's (numpy_ref.ref_rank) of
the prompt llama.cpp's server builds, the order, top_n and return_documents, /v1/score's 1:1, 1:N and N:N,
Cohere's SDK, and the refusals (not a reranker, bad bodies, a BERT encoder)."""
from __future__ import annotations

import cohere
import httpx
import pytest
from gguf import GGUFWriter

from pyserve import LLM
from pyserve.bench.launch import ServerProcess
from support import numpy_ref as nr
from support.model_factory import tokenizer_vocab, write_test_model

TEMPLATE = "Query: {query}\nDocument: {document}\nRelevant:"
QUERY = "where do cats sleep?"
DOCS = ["Cats sleep on the mat.", "The stock market fell.", "A dog ran in the park.", "Kittens nap in boxes."]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("rerankers")
    return {"rr2": write_test_model(d / "rr2.gguf", "qwen3", rerank=2, rerank_template=TEMPLATE, seed=3),
            "rr1": write_test_model(d / "rr1.gguf", "qwen3", rerank=1, rerank_bias=True, seed=4)}


@pytest.fixture(scope="module")
def server(models, model_path):
    s = ServerProcess("--model", f"rr2={models['rr2']}", "--model", f"rr1={models['rr1']}",
                      "--model", f"base={model_path}", threads=1).wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def ids(http, model: str, text: str) -> list[int]:
    r = http.post("/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False})
    return r.json()["tokens"]


def prompt_ids(http, models, model: str, query: str, doc: str) -> list[int]:
    """llama.cpp's format_prompt_rerank: the template filled in, else [BOS] query document (no EOS added)."""
    if model == "rr2":
        return ids(http, model, TEMPLATE.replace("{query}", query).replace("{document}", doc))
    bos = tokenizer_vocab()[3]  # model_factory's files add a BOS and no EOS
    return [bos] + ids(http, model, query) + ids(http, model, doc)


def post_ok(http, path: str, body: dict) -> dict:
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("model", ["rr2", "rr1"])
def test_scores_are_the_reference_and_sorted(http, models, model):
    docs = [DOCS[0], {"text": DOCS[1]}, DOCS[2], {"text": DOCS[3]}]
    body = post_ok(http, "/v1/rerank", {"model": model, "query": QUERY, "documents": docs})
    prompts = [prompt_ids(http, models, model, QUERY, d) for d in DOCS]
    want = [nr.ref_rank(models[model], p) for p in prompts]
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert sorted(got) == [0, 1, 2, 3] and len(set(want)) == 4
    for i, w in enumerate(want):  # P(yes) in [0, 1]; the one-row head's raw logit
        assert got[i] == pytest.approx(w, rel=2e-3, abs=1e-3), (i, got[i], w)
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert [r["document"]["text"] for r in body["results"]] == [DOCS[r["index"]] for r in body["results"]]
    n = sum(len(p) for p in prompts)
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n} and body["model"] == model
    assert body["object"] == "list" and body["id"]
    if model == "rr2":
        assert all(0.0 < s < 1.0 for s in scores)


def test_top_n_and_no_documents_on_the_llama_cpp_path(http):
    full = post_ok(http, "/v1/rerank", {"model": "rr2", "query": QUERY, "documents": DOCS})["results"]
    top = post_ok(http, "/rerank", {"model": "rr2", "query": QUERY, "documents": DOCS, "top_n": 2,
                                     "return_documents": False})["results"]
    assert [r["index"] for r in top] == [r["index"] for r in full[:2]]
    assert [r["relevance_score"] for r in top] == [r["relevance_score"] for r in full[:2]]  # batch-invariant
    assert all(set(r) == {"index", "relevance_score"} for r in top)
    assert len(post_ok(http, "/v1/rerank", {"model": "rr2", "query": QUERY, "documents": DOCS,
                                            "top_n": 9})["results"]) == 4


def test_score_one_to_one_one_to_many_and_pairwise(http):
    ranked = post_ok(http, "/v1/rerank", {"model": "rr2", "query": QUERY, "documents": DOCS})
    by_doc = {r["index"]: r["relevance_score"] for r in ranked["results"]}
    many = post_ok(http, "/v1/score", {"model": "rr2", "text_1": QUERY, "text_2": DOCS})
    assert [d["index"] for d in many["data"]] == [0, 1, 2, 3] and all(d["object"] == "score" for d in many["data"])
    assert [d["score"] for d in many["data"]] == [by_doc[i] for i in range(4)]
    assert many["object"] == "list" and many["model"] == "rr2" and many["usage"] == dict(ranked["usage"], completion_tokens=0)
    one = post_ok(http, "/v1/score", {"model": "rr2", "text_1": QUERY, "text_2": DOCS[3]})
    assert [d["score"] for d in one["data"]] == [by_doc[3]]
    pair = post_ok(http, "/v1/score", {"model": "rr2", "text_1": [QUERY, "stocks"], "text_2": [DOCS[0], DOCS[1]]})
    alone = post_ok(http, "/v1/score", {"model": "rr2", "text_1": "stocks", "text_2": DOCS[1]})
    assert [d["score"] for d in pair["data"]] == [by_doc[0], alone["data"][0]["score"]]


@pytest.mark.parametrize("client", [cohere.Client, cohere.ClientV2])
def test_cohere_clients_parse_the_ranking(server, http, client):
    want = post_ok(http, "/v1/rerank", {"model": "rr2", "query": QUERY, "documents": DOCS, "top_n": 3})["results"]
    got = client(api_key="unused", base_url=server.url).rerank(model="rr2", query=QUERY, documents=DOCS, top_n=3)
    assert [(r.index, r.relevance_score) for r in got.results] == [(r["index"], r["relevance_score"]) for r in want]


def error(http, path: str, body: dict) -> dict:
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    return r.json()["error"]


@pytest.mark.parametrize("path,body", [("/v1/rerank", {"query": QUERY, "documents": DOCS}),
                                       ("/v1/score", {"text_1": QUERY, "text_2": DOCS})])
def test_a_model_that_is_no_reranker_is_a_400(http, path, body):
    e = error(http, path, dict(body, model="base"))
    assert e["param"] == "model" and "not a reranker" in e["message"] and "cls.output.weight" in e["message"]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/rerank", {"documents": DOCS}, "query"), ("/v1/rerank", {"query": "", "documents": DOCS}, "query"),
    ("/v1/rerank", {"query": QUERY}, "documents"), ("/v1/rerank", {"query": QUERY, "documents": []}, "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": [""]}, "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": [{"txt": "a"}]}, "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": [3]}, "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS, "top_n": -1}, "top_n"),
    ("/v1/rerank", {"query": QUERY, "documents": DOCS, "return_documents": "yes"}, "return_documents"),
    ("/v1/rerank", {"query": QUERY, "documents": ["x " * 5000]}, "documents"),
    ("/v1/rerank", {"query": "x " * 5000, "documents": DOCS}, "query"),
    ("/v1/score", {"text_1": "x " * 5000, "text_2": DOCS}, "text_1"),
    ("/v1/score", {"text_1": QUERY, "text_2": ["x " * 300]}, "text_2"),
    ("/v1/score", {"text_1": QUERY}, "text_2"), ("/v1/score", {"text_2": DOCS}, "text_1"),
    ("/v1/score", {"text_1": [], "text_2": DOCS}, "text_1"),
    ("/v1/score", {"text_1": [QUERY, QUERY], "text_2": DOCS}, "text_1"),
    ("/v1/score", {"text_1": QUERY, "text_2": [""]}, "text_2"),
])
def test_bad_bodies_are_a_400_naming_the_field(http, path, body, param):
    e = error(http, path, dict(body, model="rr2"))
    assert e["param"] is not None and e["param"].split(".")[0].split("[")[0] == param, e


def test_a_bert_encoder_is_refused_naming_its_architecture(tmp_path):
    path = tmp_path / "bge.gguf"
    w = GGUFWriter(str(path), "bert")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(Exception, match="unsupported architecture 'bert': a BERT-style encoder"):
        LLM(str(path), n_threads=1)


def test_engine_rank_pooling_chunked_equals_whole_and_the_reference(models, llm):
    prompt = [tokenizer_vocab()[3]] + [(7 * i) % 250 + 20 for i in range(40)]
    whole = LLM(str(models["rr2"]), n_threads=1).embed({"prompt_token_ids": prompt}, pooling="rank")[0]
    chunked = LLM(str(models["rr2"]), n_threads=1, max_num_batched_tokens=5)
    assert chunked.embed({"prompt_token_ids": prompt}, pooling="rank")[0].tolist() == whole.tolist()  # [1]
    assert whole[0] == pytest.approx(nr.ref_rank(models["rr2"], prompt), abs=1e-3)
    with pytest.raises(ValueError, match="not a reranker"):
        llm.embed("hello", pooling="rank")
