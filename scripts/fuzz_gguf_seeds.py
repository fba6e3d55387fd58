"""Seeds for the GGUF fuzzer (scripts/fuzz-gguf.sh) written by ggml's own Python writer (PyPI
`gguf`): every metadata value type (nested and NaN-holding arrays included) and every
tensor type rgml reads, a custom alignment, a tokenizer-sized vocabulary, the same file big-endian
(which rgml refuses) and as v2. Usage: fuzz_gguf_seeds.py OUT_DIR
"""
import sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGUFEndian

out = sys.argv[1]
rng = np.random.default_rng(15)

def write(name, fill, endian=GGUFEndian.LITTLE):
    w = gguf.GGUFWriter(f"{out}/{name}", "llama", endianess=endian)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

def types(w):
    w.add_name("fuzz seed")
    w.add_uint8("t.u8", 7); w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 700); w.add_int16("t.i16", -700)
    w.add_uint32("t.u32", 70000); w.add_int32("t.i32", -70000)
    w.add_uint64("t.u64", 1 << 40); w.add_int64("t.i64", -(1 << 40))
    w.add_float32("t.f32", 1.5); w.add_float64("t.f64", -2.25)
    w.add_bool("t.bool", True); w.add_string("t.str", "héllo ✓")
    w.add_array("t.strs", ["a", "bc", "", "ü"])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, float("nan"), float("inf")])
    w.add_array("t.bools", [True, False])
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_tensor("f32", rng.standard_normal((3, 4), dtype=np.float32))
    w.add_tensor("f16", rng.standard_normal(8).astype(np.float16))
    w.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    w.add_tensor("bf16", rng.integers(0, 255, (2, 8), dtype=np.uint8), raw_dtype=Q.BF16)
    for q in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q8_1, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_K):
        _, type_size = gguf.GGML_QUANT_SIZES[q]
        w.add_tensor(q.name.lower(), rng.integers(0, 255, (2, type_size), dtype=np.uint8), raw_dtype=q)

def align64(w):
    w.add_custom_alignment(64)
    w.add_tensor("a", np.ones(5, dtype=np.float32))
    w.add_tensor("b", rng.integers(0, 255, (1, 34), dtype=np.uint8), raw_dtype=Q.Q8_0)

def vocab(w):
    n = 1500
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(n)])
    w.add_token_types([1] * n)
    w.add_token_scores([float(-i) for i in range(n)])
    w.add_token_merges([f"t o{i}" for i in range(n // 2)])
    w.add_bos_token_id(1)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")

write("gguf-py-types.bin", types)
write("gguf-py-align64.bin", align64)
write("gguf-py-vocab.bin", vocab)
write("gguf-py-big-endian.bin", types, GGUFEndian.BIG)
b = bytearray(open(f"{out}/gguf-py-types.bin", "rb").read())
b[4:8] = (2).to_bytes(4, "little")
open(f"{out}/gguf-py-v2.bin", "wb").write(b)
