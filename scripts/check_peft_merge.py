#!/usr/bin/env python3
"""Checks a LoRA adapter folder the way Hugging Face PEFT reads it, without PEFT or safetensors.

Usage: check_peft_merge.py ADAPTER_DIR BASE_DIR MERGED_DIR

ADAPTER_DIR is `longtron export --checkpoint C --output ADAPTER_DIR` of a LoRA checkpoint,
BASE_DIR the Hugging Face folder it was trained on, MERGED_DIR `longtron export --checkpoint C
--merge-lora --output MERGED_DIR`. The script applies the adapter to the base as PEFT's
LoraModel does and merge_and_unload() merges it (peft/tuners/lora/layer.py, Linear.merge and
get_delta_weight): for every pair base_model.model.<module>.lora_A.weight [r, in] /
lora_B.weight [out, r], the weight <module>.weight [out, in] of the base becomes
W + scaling · (B @ A), scaling = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora; the
matrix product in float32 with torch, as PEFT computes it. It checks adapter_config.json's fields
as PEFT's LoraConfig reads them, that every adapted module exists in the base with a matching
shape and is named by target_modules (PEFT's rule: the module name equals a target or ends with
"." + target), and compares every tensor with MERGED_DIR's. Prints the largest differences and
exits 1 on any mismatch. A fixture check for developers, not part of the test suite.
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch


def read_safetensors(path):
    """name -> float32 numpy array, from the format's header (8-byte length, JSON) and data."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = np.frombuffer(body[begin:end], dtype=np.uint8)
        dtype = info["dtype"]
        if dtype == "F32":
            values = raw.view("<f4").astype(np.float32)
        elif dtype == "F16":
            values = raw.view("<f2").astype(np.float32)
        elif dtype == "BF16":
            values = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: tensor {name} has dtype {dtype}")
        out[name] = values.reshape(info["shape"])
    return out


def read_folder(folder):
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for f in files:
        out.update(read_safetensors(os.path.join(folder, f)))
    return out


def main():
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    adapter_dir, base_dir, merged_dir = sys.argv[1:]
    config = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    problems = []
    expect = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "bias": "none", "fan_in_fan_out": False}
    for key, value in expect.items():
        if config.get(key) != value:
            problems.append(f"adapter_config.json: {key} = {config.get(key)!r}, PEFT's LoRA needs {value!r}")
    r, alpha = config["r"], config["lora_alpha"]
    scaling = alpha / math.sqrt(r) if config.get("use_rslora", False) else alpha / r
    targets = config["target_modules"]
    adapter = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
    base = read_folder(base_dir)
    merged = read_folder(merged_dir)
    prefix = "base_model.model."
    modules = sorted({k[len(prefix):-len(".lora_A.weight")] for k in adapter if k.endswith(".lora_A.weight")})
    if len(adapter) != 2 * len(modules):
        problems.append(f"{len(adapter)} tensors for {len(modules)} lora_A weights (unpaired or extra tensors)")
    want = {name: torch.from_numpy(v.copy()) for name, v in base.items()}
    for module in modules:
        a = torch.from_numpy(adapter[f"{prefix}{module}.lora_A.weight"].copy())
        b = torch.from_numpy(adapter[f"{prefix}{module}.lora_B.weight"].copy())
        weight = module + ".weight"
        if weight not in want:
            problems.append(f"{module}: no {weight} in the base (PEFT would not find the module)")
            continue
        if isinstance(targets, list) and not any(module == t or module.endswith("." + t) for t in targets):
            problems.append(f"{module}: not matched by target_modules {targets}")
        w = want[weight]
        if a.shape[0] != r or b.shape[1] != r or tuple(w.shape) != (b.shape[0], a.shape[1]):
            problems.append(f"{module}: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit W {tuple(w.shape)} at r = {r}")
            continue
        want[weight] = w + (b @ a) * scaling  # PEFT: get_delta_weight, then weight.data += delta
    worst_abs, worst_rel, changed = 0.0, 0.0, 0
    if set(want) != set(merged):
        problems.append(f"tensor names differ: {sorted(set(want) ^ set(merged))[:5]}")
    for name in sorted(set(want) & set(merged)):
        got = torch.from_numpy(merged[name].copy())
        if got.shape != want[name].shape:
            problems.append(f"{name}: shape {tuple(got.shape)} vs {tuple(want[name].shape)}")
            continue
        diff = (got.double() - want[name].double()).abs()
        scale = want[name].double().abs().max().item() or 1.0
        worst_abs = max(worst_abs, diff.max().item())
        worst_rel = max(worst_rel, diff.max().item() / scale)
        changed += int(not torch.equal(want[name], torch.from_numpy(base[name].copy())))
    print(f"{len(modules)} adapted modules, r = {r}, lora_alpha = {alpha}, scaling = {scaling:.6g}, "
          f"use_rslora = {config.get('use_rslora', False)}; {changed} of {len(merged)} tensors changed by the merge")
    print(f"merged folder vs PEFT's merge: max |diff| = {worst_abs:.3g}, max |diff| / max |W| = {worst_rel:.3g}")
    if worst_rel > 1e-6:
        problems.append(f"merged tensors differ from PEFT's merge by {worst_rel:.3g} (relative; float32 allows ~1e-7)")
    for p in problems:
        print("PROBLEM:", p)
    print("OK" if not problems else f"{len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
