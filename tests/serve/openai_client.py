"""rgml serve through real clients: the `openai` package, and raw HTTP for what a client
library would refuse to send. Run by crates/rgml-cli/tests/serve.rs, which starts the server
and passes what `rgml run --temp 0` printed for each prompt.

usage: openai_client.py BASE_URL EXPECTED_JSON
EXPECTED_JSON: {"model": id, "completion": {prompt: text}, "chat": {message: text}, "max_tokens": n}
"""
import concurrent.futures
import json
import sys
import time
import urllib.error
import urllib.request

import openai

BASE, EXPECTED = sys.argv[1], json.load(open(sys.argv[2]))
MODEL, N = EXPECTED["model"], EXPECTED["max_tokens"]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0, timeout=120)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def chat(message, stream=False, **kw):
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": message}],
        temperature=0, max_tokens=N, stream=stream, **kw)


def streamed_text(chunks, chat_api):
    text, finish = "", None
    for c in chunks:
        if not c.choices:
            continue
        ch = c.choices[0]
        text += (ch.delta.content or "") if chat_api else (ch.text or "")
        finish = ch.finish_reason or finish
    return text, finish


def test_models():
    ids = [m.id for m in client.models.list().data]
    check(ids == [MODEL], f"models {ids}")


def test_completions():
    for prompt, want in EXPECTED["completion"].items():
        r = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=N)
        got = r.choices[0].text
        check(got == want, f"completion {prompt!r}: {got!r} != {want!r}")
        u = r.usage
        check(u.completion_tokens <= N and u.prompt_tokens > 0
              and u.total_tokens == u.prompt_tokens + u.completion_tokens, f"usage {u}")
        check(r.choices[0].finish_reason in ("stop", "length"), "finish_reason")
        s = client.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=N,
                                      stream=True)
        got, finish = streamed_text(s, chat_api=False)
        check(got == want, f"streamed completion {prompt!r}: {got!r} != {want!r}")
        check(finish in ("stop", "length"), f"streamed finish {finish}")


def test_chat():
    for message, want in EXPECTED["chat"].items():
        r = chat(message)
        got = r.choices[0].message.content
        check(got == want, f"chat {message!r}: {got!r} != {want!r}")
        check(r.choices[0].message.role == "assistant", "role")
        got, finish = streamed_text(chat(message, stream=True), chat_api=True)
        check(got == want, f"streamed chat {message!r}: {got!r} != {want!r}")
        check(finish in ("stop", "length"), f"streamed finish {finish}")
    # Usage at the end of a stream when asked for.
    message = next(iter(EXPECTED["chat"]))
    chunks = list(chat(message, stream=True, stream_options={"include_usage": True}))
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0,
          "include_usage")


def test_concurrent_streams():
    """8 streaming requests at once each give their solo output."""
    items = list(EXPECTED["chat"].items())
    assert len(items) >= 8, "the harness passes 8 chat prompts"

    def one(item):
        return item[1], streamed_text(chat(item[0], stream=True), chat_api=True)[0]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for want, got in pool.map(one, items[:8]):
            check(got == want, f"concurrent: {got!r} != {want!r}")


def test_logprobs():
    message = next(iter(EXPECTED["chat"]))
    r = chat(message, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens, "a logprob per token")
    first = content[0]
    check(len(first.top_logprobs) == 3 and first.logprob <= 0, "top_logprobs")
    check(first.top_logprobs[0].token == first.token, "greedy takes the most likely")


def raw(method, path, body=None, content_type="application/json"):
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(BASE + path, data=data, method=method)
    if content_type:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def error_of(status_body):
    status, body = status_body
    try:
        err = json.loads(body)["error"]
        return status, err["type"], err["message"]
    except Exception:
        return status, None, body


def test_bad_requests():
    def bad(exc, **kw):
        try:
            client.chat.completions.create(**{"model": MODEL, "max_tokens": 4,
                                              "messages": [{"role": "user", "content": "hi"}],
                                              **kw})
            check(False, f"{kw} was accepted")
        except exc as e:
            body = getattr(e, "body", None) or {}
            check(isinstance(body, dict) and body.get("message"), f"{kw}: error body {body}")

    bad(openai.NotFoundError, model="no-such-model")
    bad(openai.BadRequestError, messages=[])
    bad(openai.BadRequestError, temperature=-1)
    bad(openai.BadRequestError, max_tokens=0)
    bad(openai.BadRequestError, max_tokens=10**9)
    bad(openai.BadRequestError, messages=[{"role": "user", "content": "word " * 5000}])
    bad(openai.BadRequestError, n=17)
    bad(openai.BadRequestError, n=0)
    for body in ["{not json", '{"messages": "hi"}', '{"messages": [{"role": "user"}]}',
                 '{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', "[]"]:
        status, kind, msg = error_of(raw("POST", "/v1/chat/completions", body))
        check(status == 400 and kind == "invalid_request_error" and msg,
              f"{body!r}: {status} {kind} {msg!r}")
    status, kind, _ = error_of(raw("POST", "/v1/completions", "x" * (9 << 20)))
    check(status == 413 and kind, f"huge body: {status} {kind}")
    status, kind, _ = error_of(raw("GET", "/v1/nothing-here"))
    check(status == 404 and kind, f"unknown route: {status}")
    status, body = raw("GET", "/health")
    check(status == 200, f"health {status}")


def metric(name):
    _, body = raw("GET", "/metrics", content_type=None)
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return None


def test_dropped_connection_frees_its_slot():
    before = metric("rgml_requests_cancelled_total") or 0
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a very long story."}],
        max_tokens=400, stream=True, temperature=0.8)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.time() + 10
    while time.time() < deadline:
        if metric("rgml_slots_busy") == 0 and (metric("rgml_requests_cancelled_total") or 0) > before:
            break
        time.sleep(0.05)
    check(metric("rgml_slots_busy") == 0, "the slot is free after the client left")
    check((metric("rgml_requests_cancelled_total") or 0) > before, "counted as cancelled")
    check((metric("rgml_generated_tokens_total") or 0) > 0, "metrics count tokens")


for test in [test_models, test_completions, test_chat, test_concurrent_streams, test_logprobs,
             test_bad_requests, test_dropped_connection_frees_its_slot]:
    t0 = time.time()
    test()
    print(f"{test.__name__}: {time.time() - t0:.1f} s", file=sys.stderr)
if failures:
    print(f"{len(failures)} failure(s)", file=sys.stderr)
    sys.exit(1)
print("all passed", file=sys.stderr)
