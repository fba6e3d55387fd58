#!/usr/bin/env python3
"""Generates crates/rgml-llm/tests/fixtures/templates/llamacpp.json: every chat template in the
reference llama.cpp's models/templates/ (copied next to the fixture) rendered by llama.cpp's own Jinja engine (llama-server
--jinja, POST /apply-template) for a few conversations, for tests/chat_templates.rs.

Run from the repository root (needs the demo model in models/ and the llama-server build):
    BIN=$(bash scripts/llamacpp.sh llama-server | tail -1)
    python3 scripts/gen_template_fixtures.py "$BIN"
The time llama.cpp renders with (strftime_now, date_string) is recorded as `now` (UTC, the
script runs with TZ=UTC); the test renders with the same time. A template llama-server refuses
to load, or a conversation it refuses to render, is recorded as {"error": message}.
"""
import json, os, shutil, socket, subprocess, sys, time, urllib.request, urllib.error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LLAMACPP = os.path.expanduser("~/.cache/rgml/llamacpp/llama-cpp-python-0.3.36/vendor/llama.cpp")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "crates/rgml-llm/tests/fixtures/templates/llamacpp.json")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
CONVERSATIONS = {
    "system_user": {"messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello!"}]},
    "user_assistant_user": {"messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"}]},
    "multi_turn": {"messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "Green."},
        {"role": "user", "content": "Thanks, one more."}]},
    "tool_call": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "call_1",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "user", "content": "Thanks!"}]},
}

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    return port

def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/apply-template",
                                 data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return {"prompt": json.loads(r.read())["prompt"]}
    except urllib.error.HTTPError as e:
        return {"error": e.read().decode(errors="replace")[:500]}

def render_template(bindir, path):
    port = free_port()
    env = dict(os.environ, TZ="UTC", LD_LIBRARY_PATH=bindir)
    proc = subprocess.Popen([os.path.join(bindir, "llama-server"), "--jinja", "--chat-template-file", path,
                             "-m", MODEL, "--port", str(port), "-c", "512", "-t", "1", "--no-warmup"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(300):
            if proc.poll() is not None:
                return {"error": "llama-server refused the template: " + proc.stdout.read().decode(errors="replace")[-400:]}
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.2)
        cases = {}
        for name, conv in CONVERSATIONS.items():
            body = dict(conv, add_generation_prompt=True, chat_template_kwargs={"enable_thinking": True})
            cases[name] = post(port, body)
        return {"cases": cases}
    finally:
        proc.terminate(); proc.wait()

def main():
    bindir = sys.argv[1]
    tdir = os.path.join(LLAMACPP, "models", "templates")
    now = int(time.time())
    templates = {}
    for name in sorted(os.listdir(tdir)):
        if name.endswith(".jinja"):
            templates[name] = render_template(bindir, os.path.join(tdir, name))
            shutil.copy(os.path.join(tdir, name), os.path.dirname(OUT))
            print(name, {k: ("error" if "error" in v else "ok") for k, v in templates[name].get("cases", {}).items()} or templates[name])
    fixture = {"now": now, "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
               "enable_thinking": True, "add_generation_prompt": True,
               "conversations": CONVERSATIONS, "templates": templates}
    with open(OUT, "w") as f:
        json.dump(fixture, f, indent=1, ensure_ascii=False)
        f.write("\n")

main()
