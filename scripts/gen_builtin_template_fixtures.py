#!/usr/bin/env python3
"""Generates crates/rgml-llm/tests/fixtures/builtin/llamacpp.json: llama.cpp's built-in chat
formats (`llama_chat_apply_template`, the formatter of `--no-jinja` and of `--chat-template
NAME`), each of the names `llama_chat_builtin_templates` lists applied to a few conversations
with the assistant's turn opened; and the same function given the text of every template in
crates/rgml-llm/tests/fixtures/templates/ (its heuristic detection of the format, then the
format; null where it recognises none). For tests/chat_builtin.rs.

    LLAMA_CPP_LIB_PATH=<build>/bin PYTHONPATH=<cache>/llama-cpp-python-0.3.36 \
        python scripts/gen_builtin_template_fixtures.py
"""
import ctypes, json, os, sys

import llama_cpp as L

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates/rgml-llm/tests/fixtures/builtin/llamacpp.json")
TEMPLATES = os.path.join(ROOT, "crates/rgml-llm/tests/fixtures/templates")

CONVERSATIONS = {
    "user": [("user", "Hello!")],
    "system_user": [("system", "You are a helpful assistant."), ("user", "Hello!")],
    "multi_turn": [("system", "  Answer briefly.  "), ("user", " Name a colour. "),
                   ("assistant", " Blue. "), ("user", "Another one?"),
                   ("assistant", "Green."), ("user", "Thanks, one more.")],
    "no_system": [("user", "What is 2+2?"), ("assistant", "4"), ("user", "And 3+3?")],
}


def apply(tmpl: bytes, messages):
    chat = (L.llama_chat_message * len(messages))()
    keep = []
    for i, (role, content) in enumerate(messages):
        r, c = role.encode(), content.encode()
        keep += [r, c]
        chat[i].role, chat[i].content = r, c
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = L.llama_chat_apply_template(tmpl, chat, len(messages), True, buf, size)
    if n < 0:
        return None
    return buf.raw[:n].decode("utf-8")


def main():
    names = (ctypes.c_char_p * 256)()
    count = L.llama_chat_builtin_templates(names, 256)
    builtin = {}
    for i in range(count):
        name = names[i].decode()
        builtin[name] = {c: apply(name.encode(), m) for c, m in CONVERSATIONS.items()}
    detected = {}
    for file in sorted(os.listdir(TEMPLATES)):
        if not file.endswith(".jinja"):
            continue
        with open(os.path.join(TEMPLATES, file), "rb") as f:
            source = f.read()
        detected[file] = {c: apply(source, m) for c, m in CONVERSATIONS.items()}
    conversations = {c: [{"role": r, "content": t} for r, t in m] for c, m in CONVERSATIONS.items()}
    with open(OUT, "w") as f:
        json.dump({"conversations": conversations, "builtin": builtin, "detected": detected},
                  f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{count} built-in formats, {len(detected)} templates -> {OUT}", file=sys.stderr)


main()
