#!/usr/bin/python3
"""Writes tests/fixtures/llama_golden/: a tiny random Llama model as a Hugging Face folder
(config.json, model.safetensors) and golden.safetensors with one packed row, the float64 loss of
Hugging Face's Llama semantics on it and the gradient of that loss for every tensor. Then, for the
same weights and row, tests/fixtures/llama_rope_{linear,llama3}/ (config.json, golden.safetensors
with float32-rounded gradients) with rope_scaling of those types, whose inverse frequencies follow
transformers' modeling_rope_utils.py (_compute_linear_scaling_rope_parameters,
_compute_llama3_parameters), and tests/fixtures/llama_head_dim/ (its own weights) with a head_dim
that is not hidden_size / num_attention_heads; then qwen2_golden (q/k/v bias), qwen2_tied (tie_word_embeddings: no lm_head.weight, the head is
the embedding, whose gradient is the sum of both uses), llama_attention_bias
(q/k/v and o bias) and mistral_golden (sliding_window null), each with its own weights;
mistral_window / qwen2_window (config.json and golden only: the weights of mistral_golden /
qwen2_golden) with windows shorter than the documents; and llama_mlp_bias (mlp_bias: biases on
gate/up/down_proj, LlamaMLP's nn.Linear(..., bias=config.mlp_bias)) with its own weights; then
qwen3_golden and qwen3_tied (Qwen3: modeling_qwen3.py's q_norm / k_norm, a Qwen3RMSNorm over
head_dim of each query and key head after the projections and before RoPE), each with its own
weights.

The reference below is written from transformers' modeling_llama.py (LlamaRMSNorm, LlamaRotary-
Embedding with the default rope type, rotate_half/apply_rotary_pos_emb, repeat_kv, eager attention
with scaling head_dim**-0.5, LlamaMLP down(act(gate(x)) * up(x)) with act silu (each projection
with a bias under mlp_bias), lm_head, and
LlamaForCausalLM's cross entropy averaged over labels != -100), in float64. A packed row is read as
transformers reads one with position_ids restarting at 0 per document (its flash-attention varlen
path): causal attention inside each document, never across. It does not use longtron's fused wqkv
layout: q/k/v_proj are separate here, so the test also checks longtron's name mapping.

Needs PyTorch (Debian python3-torch); the test suite reads only the files written here.
Run: /usr/bin/python3 tests/tools/make_llama_golden.py tests/fixtures
"""
import json
import math
import os
import struct
import sys

import torch

torch.manual_seed(1234)
D = torch.float64
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32,
    "hidden_size": 24,
    "intermediate_size": 40,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 5000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "max_position_embeddings": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
    "initializer_range": 0.02,
}
V, H, F = CONFIG["vocab_size"], CONFIG["hidden_size"], CONFIG["intermediate_size"]
L, HQ, HKV = CONFIG["num_hidden_layers"], CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"]
HD = H // HQ  # head_dim; main() sets it to config.json's head_dim for that variant


def weights(qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False):
    """Random weights far from init scale (so every nonlinearity matters), rounded to float32.
    qk_norm: Qwen3's self_attn.q_norm / k_norm weights [head_dim] too."""
    w = {}
    def vec(name, n):
        w[name] = (torch.randn(n, dtype=D) * 0.3).float().double()
    def mat(name, rows, cols, std=0.3):
        w[name] = (torch.randn(rows, cols, dtype=D) * std).float().double()
    def norm(name):
        w[name] = (1.0 + 0.2 * torch.randn(H, dtype=D)).float().double()
    mat("model.embed_tokens.weight", V, H, 1.0)
    for i in range(L):
        p = f"model.layers.{i}."
        mat(p + "self_attn.q_proj.weight", HQ * HD, H)
        mat(p + "self_attn.k_proj.weight", HKV * HD, H)
        mat(p + "self_attn.v_proj.weight", HKV * HD, H)
        mat(p + "self_attn.o_proj.weight", H, HQ * HD)  # [H, Hq·head_dim]
        if qkv_bias:
            vec(p + "self_attn.q_proj.bias", HQ * HD)
            vec(p + "self_attn.k_proj.bias", HKV * HD)
            vec(p + "self_attn.v_proj.bias", HKV * HD)
        if o_bias:
            vec(p + "self_attn.o_proj.bias", H)
        if qk_norm:
            for name in ("q_norm", "k_norm"):
                w[p + f"self_attn.{name}.weight"] = (
                    1.0 + 0.2 * torch.randn(HD, dtype=D)).float().double()
        mat(p + "mlp.gate_proj.weight", F, H)
        mat(p + "mlp.up_proj.weight", F, H)
        mat(p + "mlp.down_proj.weight", H, F)
        if mlp_bias:  # LlamaMLP with config.mlp_bias: nn.Linear(..., bias=True) on all three
            vec(p + "mlp.gate_proj.bias", F)
            vec(p + "mlp.up_proj.bias", F)
            vec(p + "mlp.down_proj.bias", H)
        norm(p + "input_layernorm.weight")
        norm(p + "post_attention_layernorm.weight")
    norm("model.norm.weight")
    mat("lm_head.weight", V, H)
    return w


def packed_row():
    """Documents of 9, 1, 6 and 8 tokens and a 3-token pad segment (id 0, no labels)."""
    ids, labels, pos, cu = [], [], [], [0]
    g = torch.Generator().manual_seed(99)
    for n in (9, 1, 6, 8):
        doc = torch.randint(1, V, (n,), generator=g).tolist()
        ids += doc
        labels += doc[1:] + [-100]
        pos += list(range(n))
        cu.append(cu[-1] + n)
    ids += [0] * 3
    labels += [-100] * 3
    pos += [0, 1, 2]
    cu.append(cu[-1] + 3)
    return ids, labels, pos, cu


def rms_norm(x, w, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def inv_freq_of(config):
    inv_freq = 1.0 / (config["rope_theta"] ** (torch.arange(0, HD, 2, dtype=D) / HD))
    scaling = config.get("rope_scaling")
    if scaling is None:
        return inv_freq
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    assert scaling["rope_type"] == "llama3"
    old_len = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def forward(w, ids, labels, pos, cu, config):
    n = len(ids)
    inv_freq = inv_freq_of(config)
    freqs = torch.tensor(pos, dtype=D)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]  # [n, 1, HD]
    seg = torch.zeros(n, dtype=torch.long)
    for s in range(len(cu) - 1):
        seg[cu[s] : cu[s + 1]] = s
    i = torch.arange(n)
    allowed = (seg[:, None] == seg[None, :]) & (i[None, :] <= i[:, None])
    def mask_of(layer):
        # Sliding window (Mistral; Qwen2 with use_sliding_window from layer max_window_layers on):
        # key j visible to query i when i - W < j <= i.
        window = config.get("sliding_window") if config["model_type"] == "mistral" else None
        if config["model_type"] in ("qwen2", "qwen3") and config.get("use_sliding_window"):
            if layer >= config["max_window_layers"]:
                window = config["sliding_window"]
        keep = allowed if window is None else allowed & (i[:, None] - i[None, :] < window)
        return torch.zeros(n, n, dtype=D).masked_fill(~keep, float("-inf"))
    eps = CONFIG["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        def proj(name):
            y = h @ w[p + f"self_attn.{name}.weight"].T
            return y + w[p + f"self_attn.{name}.bias"] if p + f"self_attn.{name}.bias" in w else y
        q = proj("q_proj").view(n, HQ, HD)
        k = proj("k_proj").view(n, HKV, HD)
        v = proj("v_proj").view(n, HKV, HD)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3Attention: RMSNorm of each head before RoPE
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = HQ // HKV  # repeat_kv: query head j uses kv head j // rep
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("ihd,jhd->hij", q, k) * HD ** -0.5 + mask_of(l)
        probs = torch.softmax(scores, dim=-1)
        attn = torch.einsum("hij,jhd->ihd", probs, v).reshape(n, HQ * HD)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        if p + "self_attn.o_proj.bias" in w:
            x = x + w[p + "self_attn.o_proj.bias"]
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        def mlp(name, y):
            y = y @ w[p + f"mlp.{name}.weight"].T
            return y + w[p + f"mlp.{name}.bias"] if p + f"mlp.{name}.bias" in w else y
        gate = torch.nn.functional.silu(mlp("gate_proj", h))
        x = x + mlp("down_proj", gate * mlp("up_proj", h))
    x = rms_norm(x, w["model.norm.weight"], eps)
    # tie_word_embeddings (PreTrainedModel.tie_weights): lm_head.weight IS embed_tokens.weight, so
    # autograd sums the embedding's and the head's gradients into one tensor.
    head = w["model.embed_tokens.weight"] if config.get("tie_word_embeddings") else w["lm_head.weight"]
    logits = x @ head.T
    return torch.nn.functional.cross_entropy(logits, torch.tensor(labels), ignore_index=-100)


def write_safetensors(path, tensors):
    """tensors: name → (dtype string, shape, bytes)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def f32(t):
    return ("F32", list(t.shape), t.float().contiguous().numpy().tobytes())


def f64(t):
    return ("F64", list(t.shape), t.double().contiguous().numpy().tobytes())


def i64(values):
    return ("I64", [len(values)], struct.pack(f"<{len(values)}q", *values))


def run(w, config):
    for t in w.values():
        t.grad = None
        t.requires_grad_(True)
    ids, labels, pos, cu = packed_row()
    loss = forward(w, ids, labels, pos, cu, config)
    loss.backward()
    golden = {"input_ids": i64(ids), "labels": i64(labels), "indexes": i64(pos), "cu_seqlens": i64(cu),
              "loss": ("F64", [], struct.pack("<d", loss.item()))}
    return loss.item(), golden


def write_config(out, config):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def write_fixture(root, name, w, config, with_model=True, grad=f32):
    """Runs `w` under `config` and writes root/name: config.json, golden.safetensors (loss,
    logits and every gradient, as `grad` stores it) and, with_model, model.safetensors."""
    loss, golden = run(w, config)
    for k, t in w.items():
        golden["grad." + k] = grad(t.grad)
    out = os.path.join(root, name)
    write_config(out, config)
    if with_model:
        write_safetensors(os.path.join(out, "model.safetensors"), {k: f32(t.detach()) for k, t in w.items()})
    write_safetensors(os.path.join(out, "golden.safetensors"), golden)
    return loss


def main(root):
    w = weights()
    loss = write_fixture(root, "llama_golden", w, CONFIG, grad=f64)
    print(f"llama_golden: loss {loss:.17g}, {len(w)} tensors")
    variants = {
        "llama_rope_linear": {"rope_type": "linear", "factor": 2.0},
        "llama_rope_llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    }
    for name, scaling in variants.items():
        config = dict(CONFIG, rope_scaling=scaling)
        loss = write_fixture(root, name, w, config, with_model=False)
        print(f"{name}: loss {loss:.17g}, inv_freq {inv_freq_of(config).tolist()}")
    # head_dim 8 with hidden 24 and 4 heads: q/k/v have 32/16/16 features, o_proj is [24, 32].
    global HD
    HD = 8
    torch.manual_seed(4321)
    config = dict(CONFIG, head_dim=HD)
    w = weights()
    loss = write_fixture(root, "llama_head_dim", w, config)
    print(f"llama_head_dim: loss {loss:.17g}")
    HD = H // HQ
    # Qwen2 (q/k/v bias, none on o) and Llama with attention_bias (q/k/v and o).
    base = {k: v for k, v in CONFIG.items() if k not in ("attention_bias", "mlp_bias")}
    families = {
        "qwen2_golden": (dict(base, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                              use_sliding_window=False, max_window_layers=1), True, False),
        "llama_attention_bias": (dict(CONFIG, attention_bias=True), True, True),
        "mistral_golden": (dict(base, architectures=["MistralForCausalLM"], model_type="mistral",
                                sliding_window=None), False, False),
        "qwen2_tied": (dict(base, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                            use_sliding_window=False, max_window_layers=1, tie_word_embeddings=True),
                       True, False),
    }
    weights_of = {}
    for name, (config, qkv_bias, o_bias) in families.items():
        torch.manual_seed(len(name))
        w = weights(qkv_bias, o_bias)
        if config.get("tie_word_embeddings"):
            del w["lm_head.weight"]  # absent from the files: the head is the embedding
        loss = write_fixture(root, name, w, config)
        print(f"{name}: loss {loss:.17g}, {len(w)} tensors")
        weights_of[name] = w
    # Windows shorter than the documents (9, 6 and 8 tokens): Mistral with W = 4 on the Mistral
    # weights, Qwen2 with W = 3 from layer 1 on (layer 0 full) on the Qwen2 weights.
    windows = {
        "mistral_window": ("mistral_golden", dict(families["mistral_golden"][0], sliding_window=4)),
        "qwen2_window": ("qwen2_golden", dict(families["qwen2_golden"][0], use_sliding_window=True,
                                               sliding_window=3, max_window_layers=1)),
    }
    for name, (base_name, config) in windows.items():
        w = weights_of[base_name]
        loss = write_fixture(root, name, w, config, with_model=False)
        print(f"{name}: loss {loss:.17g} (weights of {base_name})")
    # Llama with mlp_bias (gate/up/down_proj biases), its own weights.
    torch.manual_seed(2468)
    config = dict(CONFIG, mlp_bias=True)
    w = weights(mlp_bias=True)
    loss = write_fixture(root, "llama_mlp_bias", w, config)
    print(f"llama_mlp_bias: loss {loss:.17g}, {len(w)} tensors")
    # Qwen3 (q_norm / k_norm over head_dim before RoPE, Qwen3Attention): head_dim 8 with hidden 24
    # and 4 heads (explicit, as Qwen3-0.6B's 128 with hidden 1024 and 16 heads), its sliding
    # fields present but off (use_sliding_window false); untied without biases, and tied with
    # attention_bias (q, k, v and o), each with its own weights.
    HD = 8
    base = {k: v for k, v in CONFIG.items() if k not in ("attention_bias", "mlp_bias")}
    qwen3 = dict(base, architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=HD,
                 attention_bias=False, use_sliding_window=False, sliding_window=4,
                 max_window_layers=1)
    for name, config, bias in (("qwen3_golden", qwen3, False),
                               ("qwen3_tied", dict(qwen3, attention_bias=True,
                                                   tie_word_embeddings=True), True)):
        torch.manual_seed(len(name) * 7 + 3)
        w = weights(bias, bias, qk_norm=True)
        if config.get("tie_word_embeddings"):
            del w["lm_head.weight"]
        loss = write_fixture(root, name, w, config, grad=f64)
        print(f"{name}: loss {loss:.17g}, {len(w)} tensors")
    HD = H // HQ


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
