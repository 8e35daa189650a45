#!/usr/bin/python3
"""Writes tests/fixtures/gemma3_golden/: a tiny random Gemma 3 text model as a Hugging Face folder
(config.json, model.safetensors) and golden.safetensors with one packed row, the float64 loss of
Transformers' Gemma 3 semantics on it and the gradient of that loss for every tensor.

The reference below is written from transformers' models/gemma3/modeling_gemma3.py
(Gemma3ForCausalLM) and configuration_gemma3.py (Gemma3TextConfig), in float64:
- Gemma3TextScaledWordEmbedding: the embedding times embed_scale = hidden_size ** 0.5, a tensor
  cast to the weights' dtype (float32 here: the float32 rounding of √hidden_size);
- Gemma3RMSNorm: x · rsqrt(mean(x²) + eps) · (1 + w), w as stored (zeros at init);
- Gemma3DecoderLayer: four norms, h = x + post_attention_layernorm(attn(input_layernorm(x))),
  y = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
- Gemma3Attention: q_norm / k_norm (Gemma3RMSNorm over head_dim) after the projections and before
  RoPE, scores scaled by query_pre_attn_scalar ** -0.5, attn_logit_softcapping NOT applied (the
  attention interface is called without softcap), a window on the layers whose layer_types entry is
  "sliding_attention" (key j visible to query i when i − j < sliding_window);
- RoPE: rope_local_base_freq without scaling on sliding layers, rope_theta with rope_scaling on
  full layers (Gemma3TextModel's rotary_emb_local and rotary_emb);
- Gemma3MLP: down(gelu_pytorch_tanh(gate(x)) · up(x));
- Gemma3ForCausalLM: the tied head (lm_head is embed_tokens), then final_logit_softcapping,
  logits = cap · tanh(logits / cap), and the cross entropy averaged over labels != -100.
A packed row is read as in make_llama_golden.py: position_ids restarting at 0 per document,
causal attention inside each document, never across. Gemma3TextConfig's pad_token_id (0) makes
the embedding an nn.Embedding with padding_idx 0, whose lookups of token 0 add no gradient; in the
row below token 0 occurs only in the pad segment, whose outputs reach no label, so that gradient
is zero either way.

Needs PyTorch (Debian python3-torch); the test suite reads only the files written here.
Run: /usr/bin/python3 tests/tools/make_gemma3_golden.py tests/fixtures
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_llama_golden import (  # noqa: E402
    f32, f64, i64, packed_row, rotate_half, write_config, write_safetensors)

D = torch.float64
# Three layers, the first and last sliding (window 4, shorter than the documents of 9, 6 and 8
# tokens), the middle one full with linear RoPE scaling; query_pre_attn_scalar differs from
# head_dim; attn_logit_softcapping is small enough to change the loss if it were applied.
CONFIG = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "vocab_size": 32,
    "hidden_size": 24,
    "intermediate_size": 40,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "rope_theta": 5000.0,
    "rope_local_base_freq": 100.0,
    "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    "query_pre_attn_scalar": 12,
    "sliding_window": 4,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "final_logit_softcapping": 3.0,
    "attn_logit_softcapping": 1.0,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "torch_dtype": "float32",
    "initializer_range": 0.02,
}
V, H, F = CONFIG["vocab_size"], CONFIG["hidden_size"], CONFIG["intermediate_size"]
L, HQ, HKV, HD = (CONFIG[k] for k in ("num_hidden_layers", "num_attention_heads",
                                     "num_key_value_heads", "head_dim"))


def weights():
    """Random weights far from init scale, rounded to float32; the norm weights near 0 (so that
    1 + w is near 1) but not 0, so that a norm read as x · w instead of x · (1 + w) fails."""
    w = {}
    def mat(name, rows, cols, std=0.3):
        w[name] = (torch.randn(rows, cols, dtype=D) * std).float().double()
    def norm(name, n=H):
        w[name] = (0.2 * torch.randn(n, dtype=D)).float().double()
    mat("model.embed_tokens.weight", V, H, 0.3)
    for i in range(L):
        p = f"model.layers.{i}."
        mat(p + "self_attn.q_proj.weight", HQ * HD, H)
        mat(p + "self_attn.k_proj.weight", HKV * HD, H)
        mat(p + "self_attn.v_proj.weight", HKV * HD, H)
        mat(p + "self_attn.o_proj.weight", H, HQ * HD)
        norm(p + "self_attn.q_norm.weight", HD)
        norm(p + "self_attn.k_norm.weight", HD)
        mat(p + "mlp.gate_proj.weight", F, H)
        mat(p + "mlp.up_proj.weight", F, H)
        mat(p + "mlp.down_proj.weight", H, F)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            norm(p + name + ".weight")
    norm("model.norm.weight")
    return w


def gemma_rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def inv_freq_of(base, scaling):
    inv_freq = 1.0 / (base ** (torch.arange(0, HD, 2, dtype=D) / HD))
    if scaling is None:
        return inv_freq
    assert scaling["rope_type"] == "linear"
    return inv_freq / scaling["factor"]


def forward(w, ids, labels, pos, cu, config):
    n = len(ids)
    assert 0 not in ids[: cu[-2]], "token 0 (padding_idx) only in the pad segment"
    eps = config["rms_norm_eps"]
    seg = torch.zeros(n, dtype=torch.long)
    for s in range(len(cu) - 1):
        seg[cu[s] : cu[s + 1]] = s
    i = torch.arange(n)
    allowed = (seg[:, None] == seg[None, :]) & (i[None, :] <= i[:, None])
    def rope_of(sliding):
        if sliding:
            inv_freq = inv_freq_of(config["rope_local_base_freq"], None)
        else:
            inv_freq = inv_freq_of(config["rope_theta"], config.get("rope_scaling"))
        freqs = torch.tensor(pos, dtype=D)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, None, :], emb.sin()[:, None, :]
    def mask_of(sliding):
        window = config["sliding_window"]
        keep = allowed & (i[:, None] - i[None, :] < window) if sliding else allowed
        return torch.zeros(n, n, dtype=D).masked_fill(~keep, float("-inf"))
    embed = w["model.embed_tokens.weight"]
    scale = torch.tensor(H ** 0.5, dtype=torch.float32).double()  # embed_scale.to(float32)
    x = embed[torch.tensor(ids)] * scale
    for l in range(L):
        p = f"model.layers.{l}."
        sliding = config["layer_types"][l] == "sliding_attention"
        cos, sin = rope_of(sliding)
        h = gemma_rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(n, HQ, HD)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(n, HKV, HD)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, HKV, HD)
        q = gemma_rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
        k = gemma_rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = HQ // HKV
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("ihd,jhd->hij", q, k) * config["query_pre_attn_scalar"] ** -0.5
        probs = torch.softmax(scores + mask_of(sliding), dim=-1)
        attn = torch.einsum("hij,jhd->ihd", probs, v).reshape(n, HQ * HD)
        attn = attn @ w[p + "self_attn.o_proj.weight"].T
        x = x + gemma_rms_norm(attn, w[p + "post_attention_layernorm.weight"], eps)
        h = gemma_rms_norm(x, w[p + "pre_feedforward_layernorm.weight"], eps)
        gate = torch.nn.functional.gelu(h @ w[p + "mlp.gate_proj.weight"].T, approximate="tanh")
        mlp = (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
        x = x + gemma_rms_norm(mlp, w[p + "post_feedforward_layernorm.weight"], eps)
    x = gemma_rms_norm(x, w["model.norm.weight"], eps)
    logits = x @ embed.T  # tied: lm_head.weight is embed_tokens.weight
    cap = config.get("final_logit_softcapping")
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return torch.nn.functional.cross_entropy(logits, torch.tensor(labels), ignore_index=-100)


def main(root):
    torch.manual_seed(3003)
    w = weights()
    for t in w.values():
        t.requires_grad_(True)
    ids, labels, pos, cu = packed_row()
    loss = forward(w, ids, labels, pos, cu, CONFIG)
    loss.backward()
    golden = {"input_ids": i64(ids), "labels": i64(labels), "indexes": i64(pos),
              "cu_seqlens": i64(cu), "loss": f64(loss.detach())}
    for k, t in w.items():
        golden["grad." + k] = f64(t.grad)
    out = os.path.join(root, "gemma3_golden")
    write_config(out, CONFIG)
    write_safetensors(os.path.join(out, "model.safetensors"),
                      {k: f32(t.detach()) for k, t in w.items()})
    write_safetensors(os.path.join(out, "golden.safetensors"), golden)
    # What each Gemma 3 piece moves the loss by (each must matter for the fixture to test it).
    with torch.no_grad():
        for what, config in (("no soft-cap", dict(CONFIG, final_logit_softcapping=None)),
                             ("every layer full", dict(CONFIG, layer_types=["full_attention"] * L)),
                             ("no rope scaling", dict(CONFIG, rope_scaling=None))):
            other = forward(w, ids, labels, pos, cu, config).item()
            print(f"  {what}: loss {other:.17g} ({other - loss.item():+.3g})")
    print(f"gemma3_golden: loss {loss.item():.17g}, {len(w)} tensors")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
