#!/usr/bin/env python3
"""Reference tokenizations of llama.cpp for GGUF vocabularies, one fixture per file.

    python3 scripts/gen_token_fixtures.py [--pre NAME] [MODEL.gguf ...]

Without arguments it covers the files rgml's tokenizer parity test reads (see FILES): Gemma 3
(SentencePiece without a space prefix), llama.cpp's vocabulary-only files for Llama 3 (BPE,
`llama-bpe`), Qwen2 (BPE, `qwen2`), Qwen3.5 (BPE, `qwen35`), Gemma 4 (BPE over raw UTF-8, `gemma4`), Phi-3 and LLaMA (SentencePiece), BERT's bge (WordPiece),
and the demo model (SmolLM2, BPE). `scripts/fetch-model.sh` and `scripts/fetch-vocab.sh` put them in models/.

Pre-tokenizers llama.cpp ships no vocabulary for (see RELABELLED: `gpt-4o`) are tested on a
copy of one of those files with `tokenizer.ggml.pre` set to their name (`--pre NAME`): the
copy is written to a temporary file with the vendored gguf-py and tokenized there, and the
fixture, `<file stem>.<NAME>.json`, names the original file and its sha256 plus `"pre":
NAME`, so that the parity test makes the same copy (with rgml's GGUF writer) rather than a
binary file being committed. Such a fixture adds prompts aimed at that pre-tokenizer
(EXTRA_PROMPTS) and takes llama.cpp's `.inp` texts of the original file without checking
them against its `.out` (which holds the original pre-tokenizer's ids).

It needs llama.cpp's shared libraries (found through `LLAMA_CPP_LIB_PATH`) and the `llama_cpp`
Python package of the same source package (llama-cpp-python 0.3.36, its pure-Python
`llama_cpp/` folder) on `PYTHONPATH`; only the vocabulary is loaded (`vocab_only`).

For each file it writes `crates/rgml-llm/tests/fixtures/tokens/<file stem>.json`: the file's
path under the repository and sha256; what llama.cpp derives for the whole vocabulary (the
BOS, EOS, padding and fill-in-the-middle ids it reports, whether it adds BOS/EOS, the
end-of-generation ids, and each token's attribute bits, run-length encoded); and per case the prompt, the options it was tokenized
with (`add_special`: BOS/EOS as the vocabulary asks; `parse_special`: control tokens written
in the text become their ids), the token ids, each token's piece (`llama_token_to_piece`,
special tokens rendered), and the detokenized text of the whole list (`llama_detokenize`
without removing BOS/EOS, once rendering special tokens, `text`, and once not, `text_plain`).
A piece or text that is not valid UTF-8 is written as a list of byte values.

The cases: a fixed prompt set (multilingual text, emoji, code, numbers, whitespace,
contractions, mixed case, the empty string, each family's chat turn, special-token texts in
awkward places) with special tokens parsed, some of it again without parsing; random strings
of those pieces and arbitrary code points (`--random N`, seeded by the file name) with random
options; and llama.cpp's own test cases
(`models/ggml-vocab-*.gguf.inp` of the same source package) where the file has them, with the
options llama.cpp's test-tokenizer-0 uses (neither) and checked against its `.out` file.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import random
import sys
import tempfile

import llama_cpp as L

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gen_model_fixtures import sha256  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "crates" / "rgml-llm" / "tests" / "fixtures" / "tokens"
FILES = [
    "models/gemma-3-270m-q4_k_m.gguf",
    "models/vocab/ggml-vocab-llama-bpe.gguf",
    "models/vocab/ggml-vocab-qwen2.gguf",
    "models/vocab/ggml-vocab-qwen35.gguf",
    "models/vocab/ggml-vocab-gemma-4.gguf",
    "models/vocab/ggml-vocab-phi-3.gguf",
    "models/vocab/ggml-vocab-llama-spm.gguf",
    "models/vocab/ggml-vocab-bert-bge.gguf",
    "models/SmolLM2-135M-Instruct.Q4_1.gguf",
]
# (file, pre-tokenizer name): fixtures of a file relabelled with another `tokenizer.ggml.pre`.
# gpt-4o (gpt-oss) uses Llama 3's kind of vocabulary, byte-level BPE with ~128k tokens.
RELABELLED = [
    ("models/vocab/ggml-vocab-llama-bpe.gguf", "gpt-4o"),
]
LLAMA_CPP = "llama-cpp-python 0.3.36 (vendored llama.cpp)"
# Where llama.cpp's own `.inp`/`.out` test cases are: the source package scripts/llamacpp.sh
# unpacks.
CACHE = pathlib.Path(
    os.environ.get("RGML_LLAMACPP_DIR")
    or pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "rgml" / "llamacpp"
)
VENDOR = CACHE / "llama-cpp-python-0.3.36" / "vendor" / "llama.cpp"
VENDOR_MODELS = VENDOR / "models"

CHAT_TURNS = {
    "gemma": "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "llama3": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "qwen": "<|im_start|>user\nHi<|im_end|>\n",
    "phi3": "<|user|>\nHi<|end|>\n<|assistant|>",
}

PROMPTS = [
    # Multilingual text.
    "我爱北京天安门。今天天气很好，我们去公园散步吧！",
    "日本語のテキストです。カタカナ、ひらがな、漢字が混ざっています。",
    "안녕하세요, 세계! 한국어 문장을 토큰화합니다.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "नमस्ते दुनिया, आप कैसे हैं? हिन्दी में लिखा गया वाक्य।",
    "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε! Η ελληνική γλώσσα έχει τόνους: άέήίόύώ ΐΰ.",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Crème brûlée, naïve façade, Ångström, São Paulo, Zürich, Łódź, Ñandú, Œuvre, ẞtraße.",
    "Mixed: English, 中文, русский, العربية, हिन्दी, ไทย — and “quotes” «guillemets» ‘single’.",
    # Emoji: plain, ZWJ sequences, flags, skin tones, variation selectors.
    "🚀 Launch! 😀😃😄 🦙🦙",
    "Family: 👩‍👩‍👧‍👦 and 👨‍💻 at work, ❤️‍🔥 and 🏳️‍🌈.",
    "Flags: 🇫🇷🇯🇵🇺🇸🇧🇷 🏴‍☠️",
    "Skin tones: 👍🏻 👍🏽 👋🏿 🧑🏾‍🚀",
    "✅ ☕ ⚡ ✨ ©️ ™ ①②③ ½ ²",
    # Code.
    "def fib(n):\n\tif n < 2:\n\t\treturn n\n\treturn fib(n - 1) + fib(n - 2)\n\n\nprint([fib(i) for i in range(10)])  # 0, 1, 1, 2, ...\n",
    "class Foo:\n    def __init__(self, x: int = 0) -> None:\n        self._x = x ** 2  # square\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * 2).collect();\n\tprintln!(\"{:?}\", v);\n    if v.len() >= 3 && v[2] != 0 { return; }\n}\n",
    "impl<'a, T: Clone> From<&'a [T]> for Wrapper<T> {\n        fn from(s: &'a [T]) -> Self { Self(s.to_vec()) }\n}",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html> {\"key\": [1, 2.5, null]}",
    # Numbers.
    "3141592653589793238462643383279502884197169399375105820974944",
    "1 12 123 1234 12345 123456 1234567 3.14159 0.001 -42 +7 1e10 6.022e23 1,000,000.00",
    "Version 2.10.3 released on 2024-11-24 at 12:30:45; call +1 (555) 010-9999.",
    "٣٤٥ ١٢ ৪৫ ๑๒๓ 一二三 ⅣⅫ",
    # Whitespace runs and newlines.
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\t",
    "\t\t\tindented with tabs",
    "   leading spaces",
    "trailing spaces   ",
    "  both  sides  ",
    "line one\nline two\n\nline four\n",
    " \n \n\n \t \t\t \t\n  \n   \n    \n",
    "a\r\nb\r\n\r\nc\r",
    "ideographic\u3000space and no-break\u00a0space",
    "many        spaces        between",
    "ends with newline\n",
    # Apostrophes and contractions.
    "I'm sure you don't know what's in it, but it's fine.",
    "I'M SHOUTING, DON'T YOU'LL WE'VE THEY'RE HE'D",
    "the dog's bone, the dogs' bones, rock 'n' roll, 'quoted', ''double''",
    "’s curly apostrophes ‘like’ these don’t count",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
    # Mixed case.
    "HeLLo WoRLD, iPhone McDonald's CamelCaseIdentifier SCREAMING_SNAKE_CASE kebab-case",
    "Hello world",
    " Hello world",
    "Hello World!",
    # Odd characters.
    "zero\u200bwidth, soft\u00adhyphen, e\u0301 vs é, \ufeffBOM, ﷺ, 𠜎𠜱𡃁, \U0010ffff",
    "control \u0001\u0002\u001f\u007f chars",
    "",
    # Special-token text of every family (as plain text where the vocabulary lacks it).
    *CHAT_TURNS.values(),
    "<s>Hello</s> <unk> <bos><eos> <|endoftext|>",
    "Hi<|im_end|><|im_start|>",
    # Special tokens against whitespace, inside words, nested, cut short, repeated.
    "<|user|>  \n Hi \t<|end|>\n\n<|assistant|> ok",
    "word<start_of_turn>word <end_of_turn> <start_of_turn",
    "<<|im_end|>> <|im_start <|eot_id|><|eot_id|> <bos><bos>",
    "  <|begin_of_text|>  x",
    "<0x0A> <0xFF> ▁ ▁▁x ▁ spaces",
    "[multimodal] <mask> <pad> <unused0> <|endoftext|>",
]

# Prompts for one pre-tokenizer's fixture only, on top of PROMPTS: each branch of its split.
EXTRA_PROMPTS = {
    "gpt-4o": [
        # Contractions join the word before them, in either case; alone they follow a
        # punctuation-or-space prefix.
        "IT'S HE'LL they'Re SHE'D we'VE I'M don't can'T x'LL o'clock 's 'S 'll 'LL ''ve",
        # Letter runs split where the case changes.
        "CamelCaseWord XMLHttpRequest getHTTPResponse iPhone McDONALD'S ABCdef aBC A a",
        # Non-ASCII letters: llama.cpp counts each as both cases; titlecase, modifier and
        # other letters; all-caps words ending in a non-ASCII capital.
        "ÉCOLE CAFÉS CAFÉ École naïve aÉb DÉJÀ vu ΑΘΉΝΑ Ωmega ǅemal ʰello ßTRASSE ÑANDÚs L'ORÉAL",
        # Combining marks: not letters to llama.cpp's rewrite of the regex.
        "cafe\u0301 x\u0301\u0301! \u0301ab Ti\u00ea\u0301ng Vi\u00ea\u0323t n\u0303o A\u030aNGSTR\u00d6M",
        # Numbers in groups of 3, with letters and signs around them.
        "1234567890 12 123 1234 12345678 ٣٤٥٦ ①②③④ 3.14159 1,000,000 abc1234def -98765",
        # Punctuation runs take newlines and slashes after them.
        "Done.\nNext!?\n\n/path/to/file// x...\r\n/ end:/\n(a)/b/ c.//\n\r/",
        # Spaces before words, punctuation and numbers, and at the end.
        "   several   spaces before   words  .  12   and at the end   ",
        # \r\n runs and whitespace around newlines.
        "a\r\n\r\nb \r\n c\r\r\n\n d\n \n\t\n  e \r\n",
        # Tabs and other whitespace.
        "\ttab\t\ttabs \t mixed\t\u3000wide\u00a0nbsp \u2009thin\t",
        # Emoji before and after words.
        "😀😃 emoji🚀 ZWJ👩‍💻 flag🇫🇷 🙂text text🙂 ❤️love",
        # CJK, Thai (vowel marks are combining) and Arabic (with harakat).
        "中文文本，日本語のテキスト、한국어 문장。",
        "ภาษาไทยมีสระบนและล่าง สวัสดีครับ",
        "العربية مع التشكيل: مَرْحَبًا بِكُم",
        # Abbreviations, apostrophes inside names, a URL.
        "U.S.A. e.g. i.e. O'Neil o'neil https://example.com/a/b?c=d&e=f#g",
    ],
}

# Characters and pieces the random cases are built from: every class the splitters and the
# special-token matcher treat differently.
POOL = [
    *"aZqXé ßΩжöñ日中한ไก्", *"0123456789٣²½", *" \t\n\r\u00a0\u3000\u2009", *".,!?;:'\"`~@#$%^&*()[]{}<>|/\\-_=+",
    "🚀", "👩‍👩‍👧", "🇫🇷", "👍🏽", "e\u0301", "\u200d", "\ufe0f", "'s", "'LL", "'re", " ", "  ", "\n\n",
    "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "<|user|>", "<|end|>", "<s>",
    "</s>", "<unk>", "<bos>", "<eos>", "<|eot_id|>", "<|begin_of_text|>", "<|endoftext|>", "<0x0A>", "▁",
    "Hello", " world", "don't", "123456", "3.14",
]


def random_text(rng: random.Random) -> str:
    """A short string of pool pieces and arbitrary code points (no surrogates)."""
    parts = []
    for _ in range(rng.randrange(0, 24)):
        if rng.random() < 0.15:
            cp = rng.randrange(0x20, 0x110000)
            parts.append(chr(cp) if not 0xD800 <= cp < 0xE000 else "?")
        else:
            parts.append(rng.choice(POOL))
    return "".join(parts)

# Cases tokenized once more with special tokens not parsed (markers become plain text).
UNPARSED = [*CHAT_TURNS.values(), "<s>Hello</s> <unk> <bos><eos> <|endoftext|>"]


def text_or_bytes(raw: bytes):
    """A string where the bytes are UTF-8, else the list of byte values."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


class Vocab:
    def __init__(self, path: pathlib.Path):
        mp = L.llama_model_default_params()
        mp.vocab_only = True
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            sys.exit(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        raw = text.encode()
        n_max = len(raw) + 16
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, n_max, add_special, parse_special)
        if n < 0:
            sys.exit(f"tokenization of {text!r} failed ({n})")
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        if n < 0:
            sys.exit(f"piece of token {token} does not fit ({-n} bytes)")
        return buf.raw[:n]

    def detokenize(self, tokens: list[int], unparse_special: bool) -> bytes:
        arr = (L.llama_token * max(1, len(tokens)))(*tokens)
        size = 64 + 64 * len(tokens)
        buf = ctypes.create_string_buffer(size)
        n = L.llama_detokenize(self.vocab, arr, len(tokens), buf, size, False, unparse_special)
        if n < 0:
            sys.exit(f"detokenization does not fit ({-n} bytes)")
        return buf.raw[:n]

    def case(self, prompt: str, add_special: bool, parse_special: bool) -> dict:
        tokens = self.tokenize(prompt, add_special, parse_special)
        return {
            "prompt": prompt,
            "add_special": add_special,
            "parse_special": parse_special,
            "tokens": tokens,
            "pieces": [text_or_bytes(self.piece(t)) for t in tokens],
            "text": text_or_bytes(self.detokenize(tokens, True)),
            "text_plain": text_or_bytes(self.detokenize(tokens, False)),
        }

    def summary(self) -> dict:
        """What llama.cpp derives for the whole vocabulary: the special ids it reports, the
        end-of-generation set, and every token's attributes (`llama_token_attr` bits) as runs
        `[first id, count, attr]`."""
        v = self.vocab
        n = L.llama_vocab_n_tokens(v)
        attrs = [L.llama_vocab_get_attr(v, i) for i in range(n)]
        runs: list[list[int]] = []
        for i, a in enumerate(attrs):
            if runs and runs[-1][2] == a:
                runs[-1][1] += 1
            else:
                runs.append([i, 1, a])

        def tok(t: int):
            return None if t < 0 else t

        return {
            "n_tokens": n,
            "bos": tok(L.llama_vocab_bos(v)),
            "eos": tok(L.llama_vocab_eos(v)),
            "pad": tok(L.llama_vocab_pad(v)),
            "fim": [tok(getattr(L, "llama_vocab_fim_" + k)(v)) for k in ("pre", "suf", "mid", "pad", "rep", "sep")],
            "add_bos": bool(L.llama_vocab_get_add_bos(v)),
            "add_eos": bool(L.llama_vocab_get_add_eos(v)),
            "eog": [i for i in range(n) if L.llama_vocab_is_eog(v, i)],
            "attrs": runs,
        }

    def free(self) -> None:
        L.llama_model_free(self.model)


def llama_cpp_cases(path: pathlib.Path) -> list[tuple[str, list[int]]]:
    """llama.cpp's own test cases for `path`, split as its test-tokenizer-0 splits them, with
    the ids of its `.out` file."""
    inp = VENDOR_MODELS / (path.name + ".inp")
    out = VENDOR_MODELS / (path.name + ".out")
    if not inp.exists():
        return []
    raw = inp.read_bytes().decode("utf-8")
    sep = "\n__ggml_vocab_test__\n"
    texts, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(sep)
    expected = [[int(t) for t in line.split()] for line in out.read_text().splitlines()]
    if len(texts) != len(expected):
        sys.exit(f"{inp}: {len(texts)} cases but {len(expected)} results")
    return list(zip(texts, expected))


def relabel(src: pathlib.Path, dst: pathlib.Path, pre: str) -> None:
    """Copies the GGUF file `src` to `dst` with `tokenizer.ggml.pre` set to `pre`, with the
    vendored gguf-py (as its gguf_new_metadata.py copies a file)."""
    sys.path.insert(0, str(VENDOR / "gguf-py"))
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        # The writer adds the architecture itself; GGUF.* are the reader's header fields.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = pre if field.name == gguf.Keys.Tokenizer.PRE else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    if gguf.Keys.Tokenizer.PRE not in reader.fields:
        writer.add_key_value(gguf.Keys.Tokenizer.PRE, pre, gguf.GGUFValueType.STRING)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
    writer.close()


def fixture(path: pathlib.Path, n_random: int, pre: str | None = None) -> dict:
    """The fixture of `path`, or of its copy relabelled with pre-tokenizer `pre`."""
    if pre is None:
        vocab = Vocab(path)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            copy = pathlib.Path(tmp) / f"{path.stem}.{pre}.gguf"
            relabel(path, copy, pre)
            vocab = Vocab(copy)
    prompts = PROMPTS + EXTRA_PROMPTS.get(pre, [])
    cases = [vocab.case(p, True, True) for p in prompts]
    cases += [vocab.case(p, True, False) for p in UNPARSED]
    cases += [vocab.case(p, False, False) for p in UNPARSED[:1]]
    rng = random.Random(path.name if pre is None else f"{path.name}.{pre}")
    for _ in range(n_random):
        text = random_text(rng)
        case = vocab.case(text, rng.random() < 0.5, rng.random() < 0.5)
        case["source"] = "random"
        cases.append(case)
    for text, expected in llama_cpp_cases(path):
        case = vocab.case(text, False, False)
        # The .out file holds the ids of the file's own pre-tokenizer.
        if pre is None and case["tokens"] != expected:
            sys.exit(f"{path.name}: llama.cpp disagrees with its own .out for {text!r}")
        case["source"] = "llama.cpp .inp"
        cases.append(case)
    summary = vocab.summary()
    vocab.free()
    # Not resolved: models/ may be a link to a shared folder.
    rel = pathlib.Path(os.path.abspath(path)).relative_to(ROOT)
    head = {"file": str(rel), "sha256": sha256(path)}
    if pre is not None:
        head["pre"] = pre
    return {
        **head,
        "llama_cpp": LLAMA_CPP,
        "vocab": summary,
        "cases": cases,
    }


def render(fx: dict) -> str:
    """The fixture as JSON with one case per line, so diffs show which cases changed."""
    head = {k: v for k, v in fx.items() if k not in ("vocab", "cases")}
    lines = [json.dumps(c, ensure_ascii=False) for c in fx["cases"]]
    body = json.dumps(head, indent=1, ensure_ascii=False)[:-2]
    body += ',\n "vocab": ' + json.dumps(fx["vocab"])
    return body + ',\n "cases": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--random", type=int, default=40, metavar="N", help="random cases per file (default 40)")
    ap.add_argument("--pre", metavar="NAME", help="relabel the files with this tokenizer.ggml.pre first")
    ap.add_argument("models", nargs="*", type=pathlib.Path)
    args = ap.parse_args()
    if args.models:
        jobs = [(path, args.pre) for path in args.models]
    elif args.pre:
        jobs = [(ROOT / f, pre) for f, pre in RELABELLED if pre == args.pre]
    else:
        jobs = [(ROOT / f, None) for f in FILES] + [(ROOT / f, pre) for f, pre in RELABELLED]
    L.llama_backend_init()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for path, pre in jobs:
        fx = fixture(path, args.random, pre)
        out = OUT_DIR / (path.stem + ("" if pre is None else f".{pre}") + ".json")
        out.write_text(render(fx))
        print(f"{out.relative_to(ROOT)}: {len(fx['cases'])} cases, {out.stat().st_size} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
