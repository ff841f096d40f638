#!/usr/bin/env python3
"""An oracle for Hugging Face folders that shares no code with llm3d: Python's standard library
only (struct, json, array), from the safetensors format's description (an 8-byte little-endian
header length, a JSON header of {name: {dtype, shape, data_offsets}}, the data) and transformers'
names: GPT2LMHeadModel's (Conv1D weights stored (in, out); an unpadded vocabulary) and
LlamaForCausalLM's (q_proj, k_proj, v_proj and gate_proj, up_proj: the row blocks of llm3d's fused
qkvw and fcw) and MixtralForCausalLM's (block_sparse_moe.gate, the router; experts.M.w1 | w3: the
gate | up rows of expert M's block of llm3d's expfcw, w2: its block of expprojw), and Qwen3's
(Qwen3ForCausalLM: Llama's with self_attn.q_norm and k_norm, a head's size each) and Qwen3-MoE's
(Qwen3MoeForCausalLM: mlp.gate the router, mlp.experts.M.gate_proj | up_proj | down_proj as
Mixtral's w1 | w3 | w2). MODEL.bin:
llm.c's GPT-2 file (version 3), or llm3d's file of another architecture (version 1003: header words
8.. hold architecture, key/value heads, norm, MLP, positions, biases, untied head, MLP width; words
26.. the experts, their top-k, width, shared experts, dense layers; no wpe, no biases, RMSNorm
weights only, lmhead after lnfw when untied, then router, expfcw, expprojw of the MoE layers;
word 38: QK-norm, whose qnormw and knormw (L, hd) come last; word 39: a head's size hd, 0 for
C / NH: q|k|v of (NH + 2 NKV) hd rows, attprojw (C, NH hd)).

  st_oracle.py write MODEL.bin DIR [--dtype F32|BF16|F16] [--shards N]
      the llm.c file's GPT-2 as a folder (config.json, model.safetensors or N shards + index)
  st_oracle.py check DIR MODEL.bin [--dtype F32|BF16|F16]
      exit 0 when DIR holds exactly the llm.c file's weights (rounded to the dtype), else 1 naming
      the first difference; the folder's headers are checked as strictly as a reader must be
  st_oracle.py names DIR
      exit 0 when the folder's tensors are exactly the names and shapes its config.json implies
      (gpt2, llama, mixtral, qwen3, qwen3_moe), else 1 naming the first difference
  st_oracle.py hostile DIR KIND OUT
      a copy of folder DIR damaged one way (KIND, see HOSTILE) into OUT
"""
import array
import json
import math
import os
import shutil
import struct
import sys

SIZES = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8}


def read_llmc(path):
    """(header dict, flat list of floats) of an llm.c version-3 or llm3d version-1003 file."""
    with open(path, "rb") as f:
        hdr = struct.unpack("<256i", f.read(1024))
        data = array.array("f")
        data.frombytes(f.read())
    if hdr[0] != 20240326 or hdr[1] not in (3, 1003):
        sys.exit(f"{path}: not an fp32 llm.c (3) or llm3d (1003) file")
    maxT, V, L, NH, C, Vp = hdr[2:8]
    h = dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp, llama=False)
    if hdr[1] == 1003:
        if hdr[8] != 1:
            sys.exit(f"{path}: architecture word {hdr[8]}, not Llama's 1")
        h.update(llama=True, NKV=hdr[9], untied=bool(hdr[14]), ffn=hdr[15], E=hdr[26],
                 K=hdr[27], Fe=hdr[28], norm_topk=bool(hdr[31]), qk=bool(hdr[38]),
                 hd=hdr[39] or C // NH)
        if hdr[26] and (hdr[29] or hdr[30]):
            sys.exit(f"{path}: shared experts or dense layers: no Mixtral folder holds them")
    return h, data


def llmc_tensors(h, data):
    """The file's tensors as (name, [layers], rows, cols) slices of data, in its order."""
    L, C, Vp, T = h["L"], h["C"], h["Vp"], h["maxT"]
    if h["llama"]:
        hs, F = h["hd"], h["ffn"]
        qkv = (h["NH"] + 2 * h["NKV"]) * hs
        Ld = 0 if h["E"] else L  # with experts: every layer's MLP is the experts
        shapes = [("wte", 1, Vp, C), ("ln1w", L, 1, C), ("qkvw", L, qkv, C),
                  ("attprojw", L, C, h["NH"] * hs), ("ln2w", L, 1, C), ("fcw", Ld, 2 * F, C),
                  ("fcprojw", Ld, C, F), ("lnfw", 1, 1, C)]
        if h["untied"]:
            shapes.append(("lmhead", 1, Vp, C))
        if h["E"]:
            E, Fe = h["E"], h["Fe"]
            shapes += [("router", L, E, C), ("expfcw", L, E * 2 * Fe, C),
                       ("expprojw", L, E * C, Fe)]
        if h["qk"]:
            shapes += [("qnormw", L, 1, hs), ("knormw", L, 1, hs)]
    else:
        shapes = [("wte", 1, Vp, C), ("wpe", 1, T, C), ("ln1w", L, 1, C), ("ln1b", L, 1, C),
                  ("qkvw", L, 3 * C, C), ("qkvb", L, 1, 3 * C), ("attprojw", L, C, C),
                  ("attprojb", L, 1, C), ("ln2w", L, 1, C), ("ln2b", L, 1, C),
                  ("fcw", L, 4 * C, C), ("fcb", L, 1, 4 * C), ("fcprojw", L, C, 4 * C),
                  ("fcprojb", L, 1, C), ("lnfw", 1, 1, C), ("lnfb", 1, 1, C)]
    out, off = {}, 0
    for name, layers, rows, cols in shapes:
        n = rows * cols
        out[name] = [(data[off + l * n: off + (l + 1) * n], rows, cols) for l in range(layers)]
        off += layers * n
    if off != len(data):
        sys.exit(f"the file holds {len(data)} floats, its header {off}")
    return out


def llama_tensors(h, t):
    """LlamaForCausalLM's names, shapes and values."""
    C, V, F = h["C"], h["V"], h["ffn"]
    q, kv = h["NH"] * h["hd"], h["NKV"] * h["hd"]
    res = [("model.embed_tokens.weight", [V, C], list(t["wte"][0][0][:V * C]))]
    for l in range(h["L"]):
        p = f"model.layers.{l}."
        w = t["qkvw"][l][0]
        res += [(p + "input_layernorm.weight", [C], list(t["ln1w"][l][0])),
                (p + "self_attn.q_proj.weight", [q, C], list(w[:q * C])),
                (p + "self_attn.k_proj.weight", [kv, C], list(w[q * C:(q + kv) * C])),
                (p + "self_attn.v_proj.weight", [kv, C], list(w[(q + kv) * C:])),
                (p + "self_attn.o_proj.weight", [C, q], list(t["attprojw"][l][0])),
                (p + "post_attention_layernorm.weight", [C], list(t["ln2w"][l][0]))]
        if h["qk"]:
            hs = h["hd"]
            res += [(p + "self_attn.q_norm.weight", [hs], list(t["qnormw"][l][0])),
                    (p + "self_attn.k_norm.weight", [hs], list(t["knormw"][l][0]))]
        if h["E"]:
            res += (qwen3_moe_layer if h["qk"] else mixtral_layer)(h, t, l, p)
            continue
        fc = t["fcw"][l][0]
        res += [(p + "mlp.gate_proj.weight", [F, C], list(fc[:F * C])),
                (p + "mlp.up_proj.weight", [F, C], list(fc[F * C:])),
                (p + "mlp.down_proj.weight", [C, F], list(t["fcprojw"][l][0]))]
    res.append(("model.norm.weight", [C], list(t["lnfw"][0][0])))
    if h["untied"]:
        res.append(("lm_head.weight", [V, C], list(t["lmhead"][0][0][:V * C])))
    return res


def mixtral_layer(h, t, l, p):
    """Layer l's router and experts under MixtralForCausalLM's names (prefix p)."""
    C, E, F = h["C"], h["E"], h["Fe"]
    fc, proj = t["expfcw"][l][0], t["expprojw"][l][0]
    res = [(p + "block_sparse_moe.gate.weight", [E, C], list(t["router"][l][0]))]
    for e in range(E):
        g = fc[e * 2 * F * C:(e * 2 + 1) * F * C]
        u = fc[(e * 2 + 1) * F * C:(e + 1) * 2 * F * C]
        q = p + f"block_sparse_moe.experts.{e}."
        res += [(q + "w1.weight", [F, C], list(g)),
                (q + "w2.weight", [C, F], list(proj[e * C * F:(e + 1) * C * F])),
                (q + "w3.weight", [F, C], list(u))]
    return res


def qwen3_moe_layer(h, t, l, p):
    """Layer l's router and experts under Qwen3MoeForCausalLM's names (prefix p)."""
    C, E, F = h["C"], h["E"], h["Fe"]
    fc, proj = t["expfcw"][l][0], t["expprojw"][l][0]
    res = [(p + "mlp.gate.weight", [E, C], list(t["router"][l][0]))]
    for e in range(E):
        q = p + f"mlp.experts.{e}."
        res += [(q + "gate_proj.weight", [F, C], list(fc[e * 2 * F * C:(e * 2 + 1) * F * C])),
                (q + "up_proj.weight", [F, C], list(fc[(e * 2 + 1) * F * C:(e + 1) * 2 * F * C])),
                (q + "down_proj.weight", [C, F], list(proj[e * C * F:(e + 1) * C * F]))]
    return res


def transpose(x, rows, cols):
    """(rows, cols) row-major -> (cols, rows) row-major."""
    return [x[r * cols + c] for c in range(cols) for r in range(rows)]


def hf_tensors(h, data):
    """The folder's names, shapes and values (lists of floats) of the file's model."""
    t = llmc_tensors(h, data)
    if h["llama"]:
        return llama_tensors(h, t)
    C, V = h["C"], h["V"]
    res = [("transformer.wte.weight", [V, C], list(t["wte"][0][0][:V * C])),
           ("transformer.wpe.weight", [h["maxT"], C], list(t["wpe"][0][0]))]
    per = [("ln_1.weight", "ln1w"), ("ln_1.bias", "ln1b"), ("attn.c_attn.weight", "qkvw"),
           ("attn.c_attn.bias", "qkvb"), ("attn.c_proj.weight", "attprojw"),
           ("attn.c_proj.bias", "attprojb"), ("ln_2.weight", "ln2w"), ("ln_2.bias", "ln2b"),
           ("mlp.c_fc.weight", "fcw"), ("mlp.c_fc.bias", "fcb"),
           ("mlp.c_proj.weight", "fcprojw"), ("mlp.c_proj.bias", "fcprojb")]
    for l in range(h["L"]):
        for hf, ours in per:
            x, rows, cols = t[ours][l]
            if rows == 1:
                res.append((f"transformer.h.{l}.{hf}", [cols], list(x)))
            else:  # Conv1D: (in, out), the transpose of llm.c's (out, in)
                res.append((f"transformer.h.{l}.{hf}", [cols, rows], transpose(x, rows, cols)))
    res.append(("transformer.ln_f.weight", [C], list(t["lnfw"][0][0])))
    res.append(("transformer.ln_f.bias", [C], list(t["lnfb"][0][0])))
    return res


def encode(values, dtype):
    """Little-endian bytes of the floats in dtype (16-bit: rounded to nearest even)."""
    raw = array.array("f", values).tobytes()
    if dtype == "F32":
        return raw
    if dtype == "F16":
        return b"".join(struct.pack("<e", v) for v in values)
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", raw):
        out += struct.pack("<H", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
    return bytes(out)


def write_file(path, items, dtype):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, shape, values in items:
        b = encode(values, dtype)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def cmd_write(llmc, out, dtype="F32", shards=1):
    h, data = read_llmc(llmc)
    items = hf_tensors(h, data)
    os.makedirs(out, exist_ok=True)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": h["L"],
              "n_embd": h["C"], "n_head": h["NH"], "vocab_size": h["V"],
              "n_positions": h["maxT"], "n_inner": None, "layer_norm_epsilon": 1e-5,
              "activation_function": "gelu_new", "tie_word_embeddings": True}
    if h["llama"]:  # transformers' LlamaConfig defaults for what the file does not say
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                  "num_hidden_layers": h["L"], "hidden_size": h["C"],
                  "num_attention_heads": h["NH"], "num_key_value_heads": h["NKV"],
                  "intermediate_size": h["ffn"], "vocab_size": h["V"],
                  "max_position_embeddings": h["maxT"], "rms_norm_eps": 1e-5,
                  "rope_theta": 10000.0, "hidden_act": "silu",
                  "tie_word_embeddings": not h["untied"], "head_dim": h["hd"]}
    if h["llama"] and h["qk"]:  # Qwen3Config / Qwen3MoeConfig
        config.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3")
        if h["E"]:
            config.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                          moe_intermediate_size=h["Fe"], num_experts=h["E"],
                          num_experts_per_tok=h["K"], norm_topk_prob=h["norm_topk"])
    elif h["llama"] and h["E"]:  # MixtralConfig: intermediate_size is the experts' width
        config.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                      intermediate_size=h["Fe"], num_local_experts=h["E"],
                      num_experts_per_tok=h["K"], sliding_window=None)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    if shards == 1:
        write_file(os.path.join(out, "model.safetensors"), items, dtype)
        return 0
    per = math.ceil(len(items) / shards)
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = items[s * per:(s + 1) * per]
        write_file(os.path.join(out, name), part, dtype)
        weight_map.update({n: name for n, _, _ in part})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return 0


def read_file(path):
    """{name: (dtype, shape, bytes)}; exits naming the problem of a malformed file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        sys.exit(f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        sys.exit(f"{path}: header length {n} past the end")
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out, spans = {}, []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        count = 1
        for d in e["shape"]:
            count *= d
        if not (0 <= b <= end <= len(data)) or end - b != count * SIZES[e["dtype"]]:
            sys.exit(f"{path}: {name}: offsets {b}..{end} wrong for its shape or the data")
        spans.append((b, end, name))
        out[name] = (e["dtype"], e["shape"], data[b:end])
    spans.sort()
    spans = [s for s in spans if s[0] < s[1]]  # empty tensors hold no byte
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            sys.exit(f"{path}: {n0} and {n1} overlap")
    return out


def read_folder(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return read_file(os.path.join(d, "model.safetensors"))
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for name in files:
        out.update(read_file(os.path.join(d, name)))
    return out


def cmd_check(d, llmc, dtype="F32"):
    h, data = read_llmc(llmc)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    want = {"model_type": "gpt2", "n_layer": h["L"], "n_embd": h["C"], "n_head": h["NH"],
            "vocab_size": h["V"], "n_positions": h["maxT"]}
    if h["llama"]:
        want = {"model_type": "llama", "num_hidden_layers": h["L"], "hidden_size": h["C"],
                "num_attention_heads": h["NH"], "num_key_value_heads": h["NKV"],
                "intermediate_size": h["ffn"], "vocab_size": h["V"],
                "max_position_embeddings": h["maxT"], "tie_word_embeddings": not h["untied"],
                "hidden_act": "silu"}
        if cfg.get("head_dim") is not None or h["hd"] != h["C"] // h["NH"]:
            want["head_dim"] = h["hd"]  # absent: hidden_size / num_attention_heads
    if h["llama"] and h["qk"]:
        want.update(model_type="qwen3_moe" if h["E"] else "qwen3")
        if h["E"]:
            want.update(moe_intermediate_size=h["Fe"], num_experts=h["E"],
                        num_experts_per_tok=h["K"])
    elif h["llama"] and h["E"]:
        want.update(model_type="mixtral", intermediate_size=h["Fe"], num_local_experts=h["E"],
                    num_experts_per_tok=h["K"])
    for k, v in want.items():
        if cfg.get(k) != v:
            print(f"{d}/config.json: {k} is {cfg.get(k)!r}, the llm.c file's {v!r}")
            return 1
    got = read_folder(d)
    items = hf_tensors(h, data)
    if set(got) != {n for n, _, _ in items}:
        print(f"{d}: tensors {sorted(set(got) ^ {n for n, _, _ in items})[:4]} differ")
        return 1
    for name, shape, values in items:
        dt, sh, raw = got[name]
        if dt != dtype or sh != shape:
            print(f"{d}: {name}: {dt} {sh}, expected {dtype} {shape}")
            return 1
        if raw != encode(values, dtype):
            print(f"{d}: {name}: its bytes differ from the llm.c file's values")
            return 1
    print(f"{d}: {len(items)} tensors equal the llm.c file's ({dtype})")
    return 0


def config_shapes(cfg):
    """{name: shape} of the tensors a folder of config.json's model holds, from its keys alone."""
    mt = cfg["model_type"]
    if mt == "gpt2":
        C, L, V, T = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"]
        F = cfg.get("n_inner") or 4 * C
        out = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [T, C],
               "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
        per = {"ln_1.weight": [C], "ln_1.bias": [C], "attn.c_attn.weight": [C, 3 * C],
               "attn.c_attn.bias": [3 * C], "attn.c_proj.weight": [C, C],
               "attn.c_proj.bias": [C], "ln_2.weight": [C], "ln_2.bias": [C],
               "mlp.c_fc.weight": [C, F], "mlp.c_fc.bias": [F], "mlp.c_proj.weight": [F, C],
               "mlp.c_proj.bias": [C]}
        out.update({f"transformer.h.{l}.{k}": v for l in range(L) for k, v in per.items()})
        return out
    if mt not in ("llama", "mixtral", "qwen3", "qwen3_moe"):
        sys.exit(f"model_type {mt!r}: the oracle knows gpt2, llama, mixtral, qwen3 and qwen3_moe")
    C, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    NH = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or C // NH
    kv = (cfg.get("num_key_value_heads") or NH) * hd
    F = cfg["intermediate_size"]
    out = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
    if not cfg.get("tie_word_embeddings", False):  # LlamaConfig's and MixtralConfig's default
        out["lm_head.weight"] = [V, C]
    for l in range(L):
        p = f"model.layers.{l}."
        out.update({p + "input_layernorm.weight": [C], p + "self_attn.q_proj.weight": [NH * hd, C],
                    p + "self_attn.k_proj.weight": [kv, C], p + "self_attn.v_proj.weight": [kv, C],
                    p + "self_attn.o_proj.weight": [C, NH * hd],
                    p + "post_attention_layernorm.weight": [C]})
        if mt in ("qwen3", "qwen3_moe"):  # QK-norm: one head's size
            out.update({p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd]})
        if mt in ("llama", "qwen3"):
            out.update({p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C],
                        p + "mlp.down_proj.weight": [C, F]})
            continue
        if mt == "qwen3_moe":
            E, Fe = cfg["num_experts"], cfg["moe_intermediate_size"]
            out[p + "mlp.gate.weight"] = [E, C]
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                out.update({q + "gate_proj.weight": [Fe, C], q + "up_proj.weight": [Fe, C],
                            q + "down_proj.weight": [C, Fe]})
            continue
        E = cfg["num_local_experts"]
        out[p + "block_sparse_moe.gate.weight"] = [E, C]
        for e in range(E):
            q = p + f"block_sparse_moe.experts.{e}."
            out.update({q + "w1.weight": [F, C], q + "w2.weight": [C, F], q + "w3.weight": [F, C]})
    return out


def cmd_names(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    want, got = config_shapes(cfg), read_folder(d)
    for name in sorted(set(want) | set(got)):
        if name not in got or name not in want:
            print(f"{d}: tensor {name} {'missing from the folder' if name not in got else 'not in the model config.json describes'}")
            return 1
        if got[name][1] != want[name]:
            print(f"{d}: tensor {name} has shape {got[name][1]}, config.json implies {want[name]}")
            return 1
    print(f"{d}: {len(want)} tensors, names and shapes as config.json ({cfg['model_type']}) implies")
    return 0


HOSTILE = ["header_past_end", "overlap", "out_of_range", "shape", "dtype", "missing_shard",
           "nan", "swap_kv", "swap_experts", "swap_qk_norm"]


def rewrite_header(path, edit):
    """Applies edit(header dict, data bytearray) and writes the file back."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header, data = json.loads(blob[8:8 + n]), bytearray(blob[8 + n:])
    edit(header, data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(data))


def cmd_hostile(src, kind, out):
    shutil.copytree(src, out)
    single = os.path.join(out, "model.safetensors")
    wpe, ln = "transformer.wpe.weight", "transformer.ln_f.bias"

    def overlap(h, data):
        h[wpe]["data_offsets"] = [h[wpe]["data_offsets"][0] - 8, h[wpe]["data_offsets"][1] - 8]

    def out_of_range(h, data):
        b, e = h[ln]["data_offsets"]
        h[ln]["data_offsets"] = [b + len(data), e + len(data)]

    def shape(h, data):
        r, c = h[wpe]["shape"]
        h[wpe]["shape"] = [c, r]

    def dtype(h, data):
        h[ln]["dtype"] = "I64"
        h[ln]["shape"] = [h[ln]["shape"][0] // 2]

    def nan(h, data):
        b = h[ln]["data_offsets"][0]
        data[b + 12:b + 16] = struct.pack("<f", float("nan"))

    def swap_kv(h, data):  # layer 0's k_proj and v_proj exchanged: a well-formed wrong folder
        k, v = (f"model.layers.0.self_attn.{x}_proj.weight" for x in "kv")
        h[k]["data_offsets"], h[v]["data_offsets"] = h[v]["data_offsets"], h[k]["data_offsets"]

    def swap_experts(h, data):  # layer 0's experts 0 and 1 exchange their w1
        a, b = (f"model.layers.0.block_sparse_moe.experts.{e}.w1.weight" for e in (0, 1))
        h[a]["data_offsets"], h[b]["data_offsets"] = h[b]["data_offsets"], h[a]["data_offsets"]

    def swap_qk_norm(h, data):  # layer 0's q_norm and k_norm exchanged
        q, k = (f"model.layers.0.self_attn.{x}_norm.weight" for x in "qk")
        h[q]["data_offsets"], h[k]["data_offsets"] = h[k]["data_offsets"], h[q]["data_offsets"]

    if kind == "header_past_end":
        with open(single, "r+b") as f:
            f.write(struct.pack("<Q", os.path.getsize(single)))
    elif kind == "missing_shard":  # the second file the index names
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            os.remove(os.path.join(out, sorted(set(json.load(f)["weight_map"].values()))[1]))
    else:
        rewrite_header(single, {"overlap": overlap, "out_of_range": out_of_range,
                                "shape": shape, "dtype": dtype, "nan": nan,
                                "swap_kv": swap_kv, "swap_experts": swap_experts,
                                "swap_qk_norm": swap_qk_norm}[kind])
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "names":
        return cmd_names(argv[2])
    if len(argv) < 4 or argv[1] not in ("write", "check", "hostile"):
        sys.exit(__doc__)
    opts = dict(zip(argv[4::2], argv[5::2]))
    if argv[1] == "write":
        return cmd_write(argv[2], argv[3], opts.get("--dtype", "F32"),
                         int(opts.get("--shards", "1")))
    if argv[1] == "check":
        return cmd_check(argv[2], argv[3], opts.get("--dtype", "F32"))
    if len(argv) != 5 or argv[3] not in HOSTILE:
        sys.exit(f"KIND: one of {HOSTILE}")
    return cmd_hostile(argv[2], argv[3], argv[4])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
