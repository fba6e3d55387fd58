"""rgml serve's tools, structured output and embeddings through the `openai` package (issue 33's
real-client tests). Run by crates/rgml-cli/tests/serve.rs against a server with a template that
shows tool calls (Qwen 2.5's, Hermes <tool_call>).

usage: openai_structured.py BASE_URL MODEL_ID
"""
import json
import math
import sys
import time

import jsonschema
import openai

BASE, MODEL = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0, timeout=120)
failures = []

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}

CAT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "colour": {"enum": ["black", "white", "ginger", "grey"]},
        "indoor": {"type": "boolean"},
    },
    "required": ["name", "age", "colour", "indoor"],
    "additionalProperties": False,
}


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def test_forced_tool_call():
    for choice in ["required", {"type": "function", "function": {"name": "get_weather"}}]:
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            tools=[WEATHER], tool_choice=choice, max_tokens=120, temperature=0.7, seed=3)
        ch = r.choices[0]
        calls = ch.message.tool_calls or []
        check(ch.finish_reason == "tool_calls" and len(calls) == 1, f"{choice}: {ch}")
        if calls:
            check(calls[0].function.name == "get_weather", f"name {calls[0].function.name}")
            args = json.loads(calls[0].function.arguments)
            jsonschema.validate(args, WEATHER["function"]["parameters"])


def test_json_schema_answers_validate():
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": CAT, "strict": True}}
    for seed in range(20):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Describe a cat as JSON."}],
            response_format=fmt, max_tokens=300, temperature=1.0, seed=seed)
        text = r.choices[0].message.content
        check(r.choices[0].finish_reason == "stop", f"seed {seed}: {r.choices[0].finish_reason}")
        try:
            jsonschema.validate(json.loads(text), CAT)
        except Exception as e:  # noqa: BLE001 (report and go on)
            check(False, f"seed {seed}: {text!r}: {e}")


def test_embeddings():
    r = client.embeddings.create(model=MODEL, input=["a cat", "a dog", "the weather in Paris"])
    check(len(r.data) == 3 and [d.index for d in r.data] == [0, 1, 2], "three embeddings")
    width = len(r.data[0].embedding)
    check(width > 0 and all(len(d.embedding) == width for d in r.data), "one width")
    for d in r.data:
        norm = math.sqrt(sum(x * x for x in d.embedding))
        check(abs(norm - 1) < 1e-4, f"norm {norm}")
    check(r.data[0].embedding != r.data[1].embedding, "different texts differ")


def get_weather(city):
    return f"It is 21 degrees and sunny in {city}."


def test_agent_loop():
    """An agent's loop: the model calls the tool, the script runs it and sends the result, and
    the model answers."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                       tool_choice="required", max_tokens=120, seed=1)
    msg = r.choices[0].message
    check(bool(msg.tool_calls), f"a tool call: {msg}")
    if not msg.tool_calls:
        return
    messages.append(msg.model_dump(exclude_none=True))
    for call in msg.tool_calls:
        result = get_weather(**json.loads(call.function.arguments))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                       max_tokens=48, temperature=0)
    final = r.choices[0]
    check(final.finish_reason in ("stop", "length") and final.message.content,
          f"a final answer: {final}")
    prompt = r.usage.prompt_tokens
    check(prompt > 60, f"the tool result reached the prompt ({prompt} tokens)")


def test_bad_fields():
    def bad(**kw):
        try:
            client.chat.completions.create(
                model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}], **kw)
            check(False, f"{kw} was accepted")
        except openai.BadRequestError as e:
            body = e.body if isinstance(e.body, dict) else {}
            check(body.get("message") and body.get("type") == "invalid_request_error",
                  f"{kw}: {e.body}")

    bad(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}})
    bad(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(?=a)"}}})
    bad(response_format={"type": "nonsense"})
    bad(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "no_such_tool"}})
    bad(tools=[WEATHER], tool_choice=7)
    bad(tools="not a list")
    bad(extra_body={"grammar": "root ::= \"unterminated"})
    bad(extra_body={"grammar": 42})
    bad(temperature="hot")


def test_several_choices():
    """n = 2: two sampled choices, indexed, each an answer; the usage counts both."""
    r = client.chat.completions.create(
        model=MODEL, max_tokens=8, n=2, temperature=1.0, seed=5,
        messages=[{"role": "user", "content": "Name a colour."}])
    check([c.index for c in r.choices] == [0, 1], f"indexes {[c.index for c in r.choices]}")
    check(all(c.message.content for c in r.choices), f"an empty choice: {r.choices}")
    check(r.usage.completion_tokens >= 2, f"usage {r.usage}")
    # Streamed: each choice's deltas under its index, each choice finished once.
    texts, finished = {0: "", 1: ""}, {0: 0, 1: 0}
    for chunk in client.chat.completions.create(
            model=MODEL, max_tokens=8, n=2, temperature=1.0, seed=5, stream=True,
            messages=[{"role": "user", "content": "Name a colour."}]):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finished[c.index] += c.finish_reason is not None
    check(all(texts.values()) and finished == {0: 1, 1: 1}, f"streamed {texts} {finished}")


for test in [test_forced_tool_call, test_json_schema_answers_validate, test_embeddings,
             test_agent_loop, test_bad_fields, test_several_choices]:
    t0 = time.time()
    try:
        test()
    except Exception as e:  # noqa: BLE001 (a failed test, not a crashed script)
        check(False, f"{test.__name__} raised {e!r}")
    print(f"{test.__name__}: {time.time() - t0:.1f} s", file=sys.stderr)
if failures:
    print(f"{len(failures)} failure(s)", file=sys.stderr)
    sys.exit(1)
print("all passed", file=sys.stderr)
