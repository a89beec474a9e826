#!/usr/bin/env python3
"""Makes tests/data/glm52-tiny: a tiny random GLM-5.2-shaped model (IndexShare) and its float64
reference from transformers' GlmMoeDsaForCausalLM, on the CPU.

  pip install torch transformers      # from PyPI; CI never runs this, it uses the committed data
  python3 scripts/make_glm52_ref.py [OUT_DIR]

The model has GLM-5.2's indexer schedule (config.json: index_skip_topk_offset 3, index_topk_freq 4;
transformers: layer i is "full" iff max(i - offset + 1, 0) % freq == 0), so with 8 layers layers 0,
1, 2 and 6 run the indexer and 3, 4, 5 and 7 reuse the previous full layer's top-k. index_topk is 8
and the prompts run to 72 tokens, so the shared layers' sparse choice matters. RoPE theta 8e6 and a
1,048,576-token context as GLM-5.2 states them. transformers has no MTP forward, so the model has no
NextN block.

The GGUF files are written by the GGUF writer below (this repository's code, no gguf-py), from the
same weights transformers runs: matrices rounded to bf16 once and stored as BF16, so both sides
compute with identical values; norms, biases and the router in F32. Tensor names and layouts are
llama.cpp's glm-dsa conversion (kv_b_proj split into attn_k_b, transposed per head, and attn_v_b):
  glm52-tiny.gguf            IndexShare as a proper checkpoint: indexer tensors on full layers
                             only, glm-dsa.attention.indexer.types present
  glm52-tiny-published.gguf  as the published GLM-5.2 GGUFs: indexer tensors on every layer (the
                             shared layers' copies random, never read), no indexer.types key; the
                             schedule must be inferred from general.name
The forward runs in float64 except where transformers casts to float32 itself (the router logits,
the indexer scores). Reference outputs (reference.json, pN.logits.f32 little-endian [tokens][vocab], p2.topk.i32
[layers][tokens][index_topk] as transformers returns them, unordered) for three prompts and a
16-token greedy continuation of prompt 1 (full recompute each step).
"""
import json
import os
import struct
import sys

import numpy as np
import torch
import transformers
from transformers import GlmMoeDsaConfig, GlmMoeDsaForCausalLM

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "glm52-tiny")
N_LAYER = 8
SEED = 52

CFG = dict(
    vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=N_LAYER, num_attention_heads=2, num_key_value_heads=2,
    n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, routed_scaling_factor=2.5,
    n_group=1, topk_group=1, norm_topk_prob=True, first_k_dense_replace=1,
    kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=24, v_head_dim=32,
    index_topk=8, index_head_dim=32, index_n_heads=16,  # 16 heads: keys scoring exactly 0 (every relu 0) are rare, so no exact ties
    max_position_embeddings=1048576, rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 8000000.0},
    index_skip_topk_offset=3, index_topk_freq=4,
    tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=None,
)

# ---- GGUF writer (version 3, little-endian) ----
GT_F32, GT_BF16 = 0, 30
VT_U32, VT_F32, VT_BOOL, VT_STRING, VT_ARRAY = 4, 6, 7, 8, 9


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gkv(key, vt, val):
    out = gstr(key) + struct.pack("<I", vt)
    if vt == VT_U32:
        out += struct.pack("<I", val)
    elif vt == VT_F32:
        out += struct.pack("<f", val)
    elif vt == VT_BOOL:
        out += struct.pack("<B", 1 if val else 0)
    elif vt == VT_STRING:
        out += gstr(val)
    elif vt == VT_ARRAY:
        et, items = val
        out += struct.pack("<IQ", et, len(items))
        for it in items:
            out += struct.pack("<B", 1 if it else 0) if et == VT_BOOL else gstr(it)
    return out


def write_gguf(path, kvs, tensors, align=32):
    """kvs: [(key, vt, value)]; tensors: [(name, np array in ggml order reversed, ggml type)]."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    head += b"".join(gkv(*kv) for kv in kvs)
    infos, blobs, off = b"", [], 0
    for name, arr, gt in tensors:
        if gt == GT_BF16:
            data = torch.from_numpy(np.ascontiguousarray(arr)).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        ne = list(reversed(arr.shape))
        infos += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        infos += struct.pack("<IQ", gt, off)
        blobs.append((off, data))
        off = (off + len(data) + align - 1) // align * align
    body = head + infos
    body += b"\0" * ((align - len(body) % align) % align)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(body)
        base = f.tell()
        for o, d in blobs:
            f.seek(base + o)
            f.write(d)
        f.truncate(base + off)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def byte_tokens():
    """GPT-2's byte-to-unicode map: byte b is the token text of id b."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(SEED)
    cfg = GlmMoeDsaConfig(**CFG)
    types = list(cfg.indexer_types)
    assert types == ["full", "full", "full", "shared", "shared", "shared", "full", "shared"], types
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # the grouped-mm path has no float64
    model = GlmMoeDsaForCausalLM(cfg).eval()
    # Random weights with some spread (init gives zero biases and unit norms), matrices rounded to
    # bf16 once: the GGUF stores exactly these values.
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = p.shape[-1]
                v = torch.randn(p.shape, generator=g) * (1.0 / fan_in ** 0.5)
                p.copy_(v.to(torch.bfloat16).to(p.dtype))
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
            else:
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.05)
    sd = {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}
    for k in sd:
        if "indexer" in k:
            layer = int(k.split(".")[2])
            assert types[layer] == "full", k  # shared layers build no indexer in transformers
    model = model.to(torch.float64)

    # ---- tensors in llama.cpp's glm-dsa naming ----
    H, NOPE, V, KL = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    M = lambda k: (sd[k], GT_BF16)
    F = lambda k: (sd[k], GT_F32)
    tensors = [("token_embd.weight",) + M("model.embed_tokens.weight"),
               ("output_norm.weight",) + F("model.norm.weight"),
               ("output.weight",) + M("lm_head.weight")]
    rng = np.random.default_rng(SEED)
    dup = []  # the published files' indexer tensors on shared layers
    for il in range(N_LAYER):
        p = f"model.layers.{il}."
        b = f"blk.{il}."
        a = p + "self_attn."
        kvb = sd[a + "kv_b_proj.weight"].reshape(H, NOPE + V, KL)
        tensors += [(b + "attn_norm.weight",) + F(p + "input_layernorm.weight"),
                    (b + "attn_q_a.weight",) + M(a + "q_a_proj.weight"),
                    (b + "attn_q_a_norm.weight",) + F(a + "q_a_layernorm.weight"),
                    (b + "attn_q_b.weight",) + M(a + "q_b_proj.weight"),
                    (b + "attn_kv_a_mqa.weight",) + M(a + "kv_a_proj_with_mqa.weight"),
                    (b + "attn_kv_a_norm.weight",) + F(a + "kv_a_layernorm.weight"),
                    (b + "attn_k_b.weight", np.ascontiguousarray(kvb[:, :NOPE, :].transpose(0, 2, 1)), GT_BF16),
                    (b + "attn_v_b.weight", np.ascontiguousarray(kvb[:, NOPE:, :]), GT_BF16),
                    (b + "attn_output.weight",) + M(a + "o_proj.weight")]
        idx = [(b + "indexer.attn_q_b.weight", "wq_b.weight", GT_BF16),
               (b + "indexer.attn_k.weight", "wk.weight", GT_BF16),
               (b + "indexer.k_norm.weight", "k_norm.weight", GT_F32),
               (b + "indexer.k_norm.bias", "k_norm.bias", GT_F32),
               (b + "indexer.proj.weight", "weights_proj.weight", GT_BF16)]
        if types[il] == "full":
            tensors += [(n, sd[a + "indexer." + k], t) for n, k, t in idx]
        else:
            ref = f"model.layers.0.self_attn.indexer."
            dup += [(n, rng.standard_normal(sd[ref + k].shape).astype(np.float32) * 0.1, t) for n, k, t in idx]
        tensors += [(b + "ffn_norm.weight",) + F(p + "post_attention_layernorm.weight")]
        m = p + "mlp."
        if il < cfg.first_k_dense_replace:
            tensors += [(b + "ffn_gate.weight",) + M(m + "gate_proj.weight"),
                        (b + "ffn_up.weight",) + M(m + "up_proj.weight"),
                        (b + "ffn_down.weight",) + M(m + "down_proj.weight")]
        else:
            gu = sd[m + "experts.gate_up_proj"]
            ff = cfg.moe_intermediate_size
            tensors += [(b + "ffn_gate_inp.weight",) + F(m + "gate.weight"),
                        (b + "exp_probs_b.bias",) + F(m + "gate.e_score_correction_bias"),
                        (b + "ffn_gate_exps.weight", np.ascontiguousarray(gu[:, :ff, :]), GT_BF16),
                        (b + "ffn_up_exps.weight", np.ascontiguousarray(gu[:, ff:, :]), GT_BF16),
                        (b + "ffn_down_exps.weight",) + M(m + "experts.down_proj"),
                        (b + "ffn_gate_shexp.weight",) + M(m + "shared_experts.gate_proj.weight"),
                        (b + "ffn_up_shexp.weight",) + M(m + "shared_experts.up_proj.weight"),
                        (b + "ffn_down_shexp.weight",) + M(m + "shared_experts.down_proj.weight")]

    A = "glm-dsa."
    kv = [("general.architecture", VT_STRING, "glm-dsa"),
          ("general.name", VT_STRING, "GLM-5.2 tiny reference"),
          ("general.basename", VT_STRING, "GLM-5.2"),
          (A + "block_count", VT_U32, N_LAYER),
          (A + "context_length", VT_U32, cfg.max_position_embeddings),
          (A + "embedding_length", VT_U32, cfg.hidden_size),
          (A + "feed_forward_length", VT_U32, cfg.intermediate_size),
          (A + "expert_feed_forward_length", VT_U32, cfg.moe_intermediate_size),
          (A + "attention.head_count", VT_U32, H),
          (A + "attention.head_count_kv", VT_U32, 1),
          (A + "attention.q_lora_rank", VT_U32, cfg.q_lora_rank),
          (A + "attention.kv_lora_rank", VT_U32, KL),
          (A + "attention.key_length_mla", VT_U32, NOPE + cfg.qk_rope_head_dim),
          (A + "attention.value_length_mla", VT_U32, V),
          (A + "attention.layer_norm_rms_epsilon", VT_F32, cfg.rms_norm_eps),
          (A + "rope.dimension_count", VT_U32, cfg.qk_rope_head_dim),
          (A + "rope.freq_base", VT_F32, cfg.rope_parameters["rope_theta"]),
          (A + "expert_count", VT_U32, cfg.n_routed_experts),
          (A + "expert_used_count", VT_U32, cfg.num_experts_per_tok),
          (A + "expert_shared_count", VT_U32, cfg.n_shared_experts),
          (A + "leading_dense_block_count", VT_U32, cfg.first_k_dense_replace),
          (A + "expert_weights_scale", VT_F32, cfg.routed_scaling_factor),
          (A + "expert_weights_norm", VT_BOOL, True),
          (A + "expert_gating_func", VT_U32, 2),
          (A + "attention.indexer.head_count", VT_U32, cfg.index_n_heads),
          (A + "attention.indexer.key_length", VT_U32, cfg.index_head_dim),
          (A + "attention.indexer.top_k", VT_U32, cfg.index_topk),
          (A + "vocab_size", VT_U32, cfg.vocab_size)]
    # a byte-level BPE vocabulary without merges (token i is byte i), so glm5-run can take the file
    kv += [("tokenizer.ggml.model", VT_STRING, "gpt2"), ("tokenizer.ggml.pre", VT_STRING, "glm4"),
           ("tokenizer.ggml.tokens", VT_ARRAY, (VT_STRING, byte_tokens())),
           ("tokenizer.ggml.merges", VT_ARRAY, (VT_STRING, [])),
           ("tokenizer.ggml.bos_token_id", VT_U32, 0), ("tokenizer.ggml.eos_token_id", VT_U32, 1)]
    key = [(A + "attention.indexer.types", VT_ARRAY, (VT_BOOL, [t == "full" for t in types]))]
    write_gguf(os.path.join(OUT, "glm52-tiny.gguf"), kv + key, tensors)
    # published layout: every layer's indexer, in layer order, and no key
    order = {n: i for i, (n, _, _) in enumerate(tensors)}
    pub = sorted(tensors + dup, key=lambda t: (int(t[0].split(".")[1]) if t[0].startswith("blk.") else -1,
                                               order.get(t[0], 10**6)))
    write_gguf(os.path.join(OUT, "glm52-tiny-published.gguf"), kv, pub)

    # ---- reference outputs, float64 ----
    gen = np.random.default_rng(SEED + 1)
    prompts = [gen.integers(2, cfg.vocab_size, n).tolist() for n in (6, 40, 72)]
    ref = {"transformers": transformers.__version__, "torch": torch.__version__, "dtype": "float64",
           "config": {k: (v if not isinstance(v, dict) else dict(v)) for k, v in CFG.items()},
           "indexer_types": types, "prompts": [], "tolerance_rel_l2": [1e-3, 1e-3, 5e-3]}
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            x = torch.tensor([ids])
            out = model(input_ids=x, use_cache=False)
            lg = out.logits[0].to(torch.float32).numpy()
            lg.astype("<f4").tofile(os.path.join(OUT, f"p{i}.logits.f32"))
            e = {"ids": ids, "logits": f"p{i}.logits.f32", "argmax": lg.argmax(-1).tolist()}
            if i == 2:
                # the top-k each layer used (shared layers get the full layer's): capture per layer
                caught = []
                hooks = [l.self_attn.register_forward_hook(lambda m, a, k, o: caught.append(o[2]), with_kwargs=True)
                         for l in model.model.layers]
                model(input_ids=x, use_cache=False)
                for h in hooks:
                    h.remove()
                tk = torch.stack([c[0] for c in caught]).to(torch.int32).numpy()
                tk.astype("<i4").tofile(os.path.join(OUT, "p2.topk.i32"))
                e["topk"] = "p2.topk.i32"
            ref["prompts"].append(e)
        ids = list(prompts[1])
        greedy = []
        for _ in range(16):
            lg = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
            t = int(lg.argmax())
            greedy.append(t)
            ids.append(t)
    ref["greedy_prompt"] = 1
    ref["greedy"] = greedy
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print("wrote", OUT, "indexer types", types, "greedy", greedy)


if __name__ == "__main__":
    main()
