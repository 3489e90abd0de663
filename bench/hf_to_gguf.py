"""A Llama-shaped Hugging Face checkpoint (one model.safetensors, as
bench_random_llm writes it) as a GGUF file of llama.cpp's "llama"
architecture, its F16 tensors kept F16 and F32 ones F32, so that llama.cpp
runs the same weights as mpq (llama-quantize then makes its Q4_0 and Q4_1):

    python bench/hf_to_gguf.py DIR OUT.gguf

The rows of q and k are reordered from the checkpoint's rotary layout (the
two halves of each head rotate together) to llama.cpp's (adjacent pairs
rotate together): GGUF row 2i + a of a head is checkpoint row i + a * d / 2.
The vocabulary is a stand-in of the checkpoint's size for llama.cpp's
loader (SentencePiece type: unknown, BOS, EOS, 256 byte tokens, then
numbered pieces); the speed benchmarks draw random tokens and never read
text through it.
"""
import json
import struct
import sys

import numpy as np
import gguf

DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": None}


def read_safetensors(path):
    """name -> numpy array (memory-mapped) of every tensor of the file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        dt = DTYPES.get(t["dtype"])
        if dt is None:
            sys.exit(f"{path}: {name}: dtype {t['dtype']} is not converted (F16 and F32 are)")
        a, b = t["data_offsets"]
        count = int(np.prod(t["shape"])) if t["shape"] else 1
        if (b - a) != count * np.dtype(dt).itemsize:
            sys.exit(f"{path}: {name}: {b - a} bytes for shape {t['shape']}")
        out[name] = np.memmap(path, dtype=dt, mode="r", offset=base + a, shape=tuple(t["shape"]))
    return out


def rotary_rows(w, heads):
    """Checkpoint rows (h, a, i) -> GGUF rows (h, i, a), d = head size."""
    rows, cols = w.shape
    d = rows // heads
    return np.ascontiguousarray(w.reshape(heads, 2, d // 2, cols).swapaxes(1, 2).reshape(rows, cols))


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: python bench/hf_to_gguf.py DIR OUT.gguf")
    src, dst = sys.argv[1], sys.argv[2]
    with open(f"{src}/config.json") as f:
        c = json.load(f)
    t = read_safetensors(f"{src}/model.safetensors")
    L, H, KV = c["num_hidden_layers"], c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    D, V = c["hidden_size"], c["vocab_size"]

    w = gguf.GGUFWriter(dst, "llama")
    w.add_context_length(c.get("max_position_embeddings", 4096))
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_dimension_count(D // H)
    w.add_rope_freq_base(float(c.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-5)))
    w.add_vocab_size(V)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{k}" for k in range(V - len(tokens))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (V - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens[:V])
    w.add_token_scores([0.0] * V)
    w.add_token_types(types[:V])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for l in range(L):
        for hf, gg in per_layer.items():
            names[f"model.layers.{l}.{hf}.weight"] = f"blk.{l}.{gg}.weight"
    missing = [n for n in names if n not in t and n != "lm_head.weight"]
    if missing:
        sys.exit(f"{src}: missing {missing[0]} (and {len(missing) - 1} more)")
    for hf, gg in names.items():
        if hf not in t:
            continue  # a tied head: llama.cpp reuses token_embd
        a = t[hf]
        if gg.endswith("attn_q.weight"):
            a = rotary_rows(a, H)
        elif gg.endswith("attn_k.weight"):
            a = rotary_rows(a, KV)
        w.add_tensor(gg, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {dst}: {L} layers, dim {D}, vocab {V}")


if __name__ == "__main__":
    main()
