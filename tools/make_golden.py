#!/usr/bin/env python3
"""Make tiny random-weight Qwen checkpoints and HF transformers reference outputs.

Writes tests/fixtures/golden/<fixture>/ (see tests/fixtures/golden/README.md). Runs where torch and
transformers are installed (the GPU machine); everything runs on CPU in fp32 and is seeded, so a rerun
reproduces the same files. Checkpoints are written by hand in the real Hugging Face Hub layout of each
family (and the mlx-lm/mlx-vlm layout for the *_mlx fixtures), then loaded back with transformers.

    PYTHONUNBUFFERED=1 python3 tools/make_golden.py --out OUTDIR [--only qwen3,qwen3_5]
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import time
import traceback
import zlib
from collections import OrderedDict

import numpy as np

SEED = 20260301
VOCAB = 512
PROMPT_LENGTHS = (7, 23, 80)  # the last one crosses the 64-token GDN chunk boundary
PROMPT_TOKEN_LIMIT = 500      # ids >= 500 are the tiny configs' special tokens
N_GREEDY = 12
MLX_GROUP = 64

torch = None          # imported in main(): the helpers above the transformers section need numpy only
transformers = None

# ----------------------------------------------------------------------------------------------
# bf16 and safetensors (numpy only). Tensors are numpy arrays: uint16 = bf16 bits, float32, uint32.

ST_DTYPE = {np.dtype(np.uint16): "BF16", np.dtype(np.float32): "F32", np.dtype(np.uint32): "U32",
            np.dtype(np.uint8): "U8"}
ST_NUMPY = {"BF16": np.uint16, "F32": np.float32, "U32": np.uint32, "U8": np.uint8}


def bf16_round(x):
    """float32 -> bf16 bits, round to nearest even (what torch's .to(bfloat16) does)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = u + (((u >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF))
    return (u >> np.uint32(16)).astype(np.uint16)


def bf16_to_f32(b):
    return (np.ascontiguousarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def as_f32(a):
    return bf16_to_f32(a) if a.dtype == np.uint16 else a.astype(np.float32)


def write_safetensors(path, tensors, fmt):
    """Hand-written safetensors: u64 LE header length, JSON header (space-padded to 8), raw LE data."""
    header = {"__metadata__": {"format": fmt}}
    blobs, offset = [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        blob = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": ST_DTYPE[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)
    return offset


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        dt = np.dtype(ST_NUMPY[info["dtype"]])
        out[name] = np.frombuffer(data[8 + n + s:8 + n + e], dtype=dt.newbyteorder("<")).astype(dt).reshape(
            info["shape"])
    return out, header.get("__metadata__")


def write_checkpoint(dirpath, tensors, fmt="pt", shards=1, index=False):
    """model.safetensors, or HF-named shards model-0000i-of-0000n.safetensors + index (by sorted name)."""
    names = sorted(tensors)
    if shards == 1:
        files = [("model.safetensors", names)]
    else:
        sizes = [tensors[n].nbytes for n in names]
        target, groups, cur, acc = sum(sizes) / shards, [], [], 0
        for n, s in zip(names, sizes):
            if cur and acc + s / 2 > target * (len(groups) + 1) and len(groups) < shards - 1:
                groups.append(cur)
                cur = []
            cur.append(n)
            acc += s
        groups.append(cur)
        assert len(groups) == shards, "could not split into shards"
        files = [(f"model-{i + 1:05d}-of-{shards:05d}.safetensors", g) for i, g in enumerate(groups)]
    total, weight_map = 0, {}
    for fname, group in files:
        total += write_safetensors(os.path.join(dirpath, fname), {n: tensors[n] for n in group}, fmt)
        weight_map.update({n: fname for n in group})
    if shards > 1 or index:
        with open(os.path.join(dirpath, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f,
                      indent=2)
            f.write("\n")
    return [f for f, _ in files]


def read_checkpoint(dirpath):
    out = {}
    for f in sorted(os.listdir(dirpath)):
        if f.endswith(".safetensors"):
            out.update(read_safetensors(os.path.join(dirpath, f))[0])
    return out


# ----------------------------------------------------------------------------------------------
# MLX quantization (qwen-spec §9.1, §9.2), numpy only.

MLX_BITS = (2, 3, 4, 5, 6, 8)


def mlx_affine_quantize(w, group_size, bits):
    """w float32 [..., n] -> (wq uint32 [..., n*bits/32], scales f32, biases f32 [..., n/group])."""
    assert bits in MLX_BITS and w.shape[-1] % group_size == 0
    g = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, w.shape[-1] // group_size, group_size)
    n_bins = np.float32((1 << bits) - 1)
    w_max = g.max(axis=-1, keepdims=True)
    w_min = g.min(axis=-1, keepdims=True)
    mask = np.abs(w_min) > np.abs(w_max)
    scales = np.maximum((w_max - w_min) / n_bins, np.float32(1e-7)).astype(np.float32)
    scales = np.where(mask, scales, -scales)
    edge = np.where(mask, w_min, w_max)
    q0 = np.round(edge / scales)
    safe_q0 = np.where(q0 == 0, np.float32(1), q0)
    scales = np.where(q0 != 0, edge / safe_q0, scales).astype(np.float32)
    biases = np.where(q0 == 0, np.float32(0), edge).astype(np.float32)
    q = np.clip(np.round((g - biases) / scales), 0, n_bins).astype(np.uint32)
    q = q.reshape(*w.shape)
    gshape = (*w.shape[:-1], w.shape[-1] // group_size)
    return pack_bits(q, bits), scales.reshape(gshape), biases.reshape(gshape), q


def pack_bits(q, bits):
    """LSB-first bitstream per row: element j at stream bits [j*bits, (j+1)*bits), stream bit s = bit s % 32
    of word s // 32. For 2/4/8 bits no value straddles a word; for 3/5/6 some do."""
    assert bits in MLX_BITS and (q.shape[-1] * bits) % 32 == 0
    stream = (q.astype(np.uint32)[..., None] >> np.arange(bits, dtype=np.uint32)) & np.uint32(1)
    stream = stream.reshape(*q.shape[:-1], q.shape[-1] * bits // 32, 32).astype(np.uint64)
    return (stream << np.arange(32, dtype=np.uint64)).sum(axis=-1).astype(np.uint32)


def unpack_bits(wq, bits):
    assert bits in MLX_BITS
    stream = (wq[..., None] >> np.arange(32, dtype=np.uint32)) & np.uint32(1)
    stream = stream.reshape(*wq.shape[:-1], wq.shape[-1] * 32 // bits, bits)
    return (stream << np.arange(bits, dtype=np.uint32)).sum(axis=-1).astype(np.uint32)


def check_bitstream():
    """pack/unpack against the bitstream rule spelled out with Python integers, for every MLX width."""
    rng = np.random.default_rng([SEED, 13])
    for bits in MLX_BITS:
        q = rng.integers(0, 1 << bits, (3, 64)).astype(np.uint32)
        words = pack_bits(q, bits)
        for r in range(q.shape[0]):
            stream = sum(int(v) << (j * bits) for j, v in enumerate(q[r]))
            want = [(stream >> (32 * w)) & 0xFFFFFFFF for w in range(q.shape[1] * bits // 32)]
            assert [int(x) for x in words[r]] == want, f"pack_bits({bits}) is not the LSB-first bitstream"
        assert np.array_equal(unpack_bits(words, bits), q), f"unpack_bits({bits})"


def mlx_dequantize(wq, scales_bf16, biases_bf16, group_size, bits):
    """scale * q + bias in fp32 from the stored bf16 scales/biases."""
    q = unpack_bits(wq, bits).astype(np.float32)
    s = np.repeat(bf16_to_f32(scales_bf16), group_size, axis=-1)
    b = np.repeat(bf16_to_f32(biases_bf16), group_size, axis=-1)
    return (s * q + b).astype(np.float32)


E2M1_LUT = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
MXFP4_GROUP = 32


def e8m0_exponent(x):
    """round(log2(x)) for x > 0 (f32), as src/core/dtype.cpp f32_to_e8m0 does it exactly: with x = m * 2^e,
    m in [1, 2), it rounds up iff m >= sqrt(2) (m^2 >= 2 is exact in f64 and never a tie)."""
    m, e = np.frexp(x.astype(np.float64))       # x = m * 2^e, m in [0.5, 1)
    m2 = 2.0 * m
    return (e - 1 + (m2 * m2 >= 2.0)).astype(np.int64)


def e8m0_value(s):
    return np.ldexp(np.float32(1.0), s.astype(np.int32) - 127).astype(np.float32)


def e2m1_code(v):
    """f32 -> E2M1 code (bit 3 = sign bit of v, kept for -0), magnitude rounded to nearest, ties to the even
    code, saturating at 6. The thresholds are the midpoints between neighbouring E2M1 values."""
    a = np.abs(v)
    mag = np.select([a > 5, a >= 3.5, a > 2.5, a >= 1.75, a > 1.25, a >= 0.75, a > 0.25],
                    [7, 6, 5, 4, 3, 2, 1], 0).astype(np.uint32)
    return mag | (np.signbit(v).astype(np.uint32) << np.uint32(3))


def mxfp4_quantize(w, group_size=MXFP4_GROUP):
    """w float32 [..., n] -> (wq uint32 [..., n/8], scales uint8 E8M0 [..., n/32], codes [..., n]).
    Scale exponent round(log2(max|w| / 6)) (e8m0 = 127 + it, clamped to [0, 254]; an all-zero group gets 0),
    element = E2M1(w / 2^exponent) (src/quant/quant.cpp quantize_row)."""
    assert w.shape[-1] % group_size == 0
    g = np.ascontiguousarray(w, dtype=np.float32).reshape(*w.shape[:-1], w.shape[-1] // group_size, group_size)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    ratio = (amax / np.float32(6.0)).astype(np.float32)
    safe = np.where(amax > 0, ratio, np.float32(1.0))
    s = np.where(amax > 0, np.clip(127 + e8m0_exponent(safe), 0, 254), 0).astype(np.uint8)
    scale = e8m0_value(s)
    codes = e2m1_code((g / scale).astype(np.float32)).reshape(w.shape)
    return pack_bits(codes, 4), s[..., 0], codes


def mxfp4_dequantize(wq, scales_u8, group_size=MXFP4_GROUP):
    """lut[q] * 2^(s - 127) in fp32."""
    q = unpack_bits(wq, 4)
    return (E2M1_LUT[q] * np.repeat(e8m0_value(scales_u8), group_size, axis=-1)).astype(np.float32)


def mxfp4_mlx_differences(w, group_size=MXFP4_GROUP):
    """How many scales / codes other MLX quantizers would store differently from mxfp4_quantize (for the log).
    mlx ops.cpp fp_quantize (CPU fallback) works in the weight dtype (bf16): max|w| / 6 and log2 rounded to bf16,
    and picks the code by argmin |x - lut| (ties go to the smaller magnitude, and tiny negatives to +0, code 0).
    Some Metal/CUDA versions instead round the scale up (smallest 2^e >= max|w| / 6)."""
    wq, s, codes = mxfp4_quantize(w, group_size)
    g = w.reshape(*w.shape[:-1], w.shape[-1] // group_size, group_size).astype(np.float32)
    amax = np.abs(g).max(axis=-1)
    ratio_bf16 = bf16_to_f32(bf16_round(amax / np.float32(6.0)))
    log_bf16 = bf16_to_f32(bf16_round(np.log2(ratio_bf16).astype(np.float32)))
    s_cpu = (127 + np.round(log_bf16)).astype(np.int64)
    s_up = 127 + np.ceil(np.log2((amax / np.float32(6.0)).astype(np.float64))).astype(np.int64)
    x = (g / e8m0_value(s)[..., None]).reshape(w.shape)
    argmin = np.argmin(np.abs(x[..., None] - E2M1_LUT), axis=-1)
    return {"groups": int(s.size), "scale_differs_mlx_cpu": int((s_cpu != s).sum()),
            "scale_differs_round_up": int((s_up != s).sum()), "elements": int(codes.size),
            "code_differs_argmin": int((argmin != codes).sum()),
            "value_differs_argmin": int((E2M1_LUT[argmin] != E2M1_LUT[codes]).sum()),
            "ties": int(np.isin(np.abs(x), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]).sum())}


# ----------------------------------------------------------------------------------------------
# Tiny configs, written like the released config.json of each family (small dims, in-vocab special ids).

def text_layer_types(n, interval):
    return ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]


def config_qwen3(tv):
    return {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 510, "eos_token_id": 511, "head_dim": 32, "hidden_act": "silu", "hidden_size": 64,
        "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 4096,
        "max_window_layers": 3, "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 3,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": tv, "use_cache": True, "use_sliding_window": False, "vocab_size": VOCAB,
    }


def config_qwen3_moe(tv):
    return {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 510, "decoder_sparse_step": 1, "eos_token_id": 511, "head_dim": 16, "hidden_act": "silu",
        "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 4096,
        "max_window_layers": 3, "mlp_only_layers": [1], "model_type": "qwen3_moe", "moe_intermediate_size": 48,
        "norm_topk_prob": True, "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2,
        "num_hidden_layers": 3, "num_key_value_heads": 2, "output_router_logits": False, "rms_norm_eps": 1e-06,
        "rope_scaling": None, "rope_theta": 1000000, "router_aux_loss_coef": 0.001, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": tv, "use_cache": True,
        "use_sliding_window": False, "vocab_size": VOCAB,
    }


def config_qwen3_next(tv):
    # Like the released Qwen3-Next config: no layer_types (derived from full_attention_interval), flat
    # rope_theta / partial_rotary_factor. Dk != Dv so a transposed recurrent state cannot pass.
    return {
        "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 510, "decoder_sparse_step": 1, "eos_token_id": 511, "full_attention_interval": 4,
        "head_dim": 32, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "intermediate_size": 128, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_value_head_dim": 32,
        "max_position_embeddings": 4096, "mlp_only_layers": [], "model_type": "qwen3_next",
        "moe_intermediate_size": 48, "norm_topk_prob": True, "num_attention_heads": 4, "num_experts": 8,
        "num_experts_per_tok": 2, "num_hidden_layers": 4, "num_key_value_heads": 2, "num_nextn_predict_layers": 1,
        "output_router_logits": False, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 10000000, "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 96,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": tv, "use_cache": True,
        "use_sliding_window": False, "vocab_size": VOCAB,
    }


def vision_config(out_hidden, model_type):
    return {
        "deepstack_visual_indexes": [], "depth": 2, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 32,
        "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 64, "model_type": model_type,
        "num_heads": 2, "num_position_embeddings": 16, "out_hidden_size": out_hidden, "patch_size": 16,
        "spatial_merge_size": 2, "temporal_patch_size": 2,
    }


def config_qwen3_5(tv):
    text = {
        "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": 510,
        "dtype": "bfloat16", "eos_token_id": 511, "full_attention_interval": 4, "head_dim": 32,
        "hidden_act": "silu", "hidden_size": 128, "initializer_range": 0.02, "intermediate_size": 256,
        "layer_types": text_layer_types(4, 4), "linear_conv_kernel_dim": 4, "linear_key_head_dim": 32,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_value_head_dim": 32,
        "mamba_ssm_dtype": "float32", "max_position_embeddings": 4096, "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False, "num_attention_heads": 4,
        "num_hidden_layers": 4, "num_key_value_heads": 2, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000, "rope_type": "default"},
        "tie_word_embeddings": False, "use_cache": True, "vocab_size": VOCAB,
    }
    # vision_config model_type "qwen3_5" is what released checkpoints carry (transformers renames it).
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "image_token_id": 506, "model_type": "qwen3_5",
        "text_config": text, "tie_word_embeddings": False, "transformers_version": tv, "video_token_id": 507,
        "vision_config": vision_config(128, "qwen3_5"), "vision_end_token_id": 505, "vision_start_token_id": 504,
    }


def config_qwen3_5_moe(tv):
    # head_dim 16 x 0.25 = 4 rotary dims -> mrope_section sums to 2. Dk 32 != Dv 16; every in-dim is 64
    # so the 4-bit sibling quantizes every Linear.
    text = {
        "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": 510,
        "dtype": "bfloat16", "eos_token_id": 511, "full_attention_interval": 4, "head_dim": 16,
        "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
        "layer_types": text_layer_types(4, 4), "linear_conv_kernel_dim": 4, "linear_key_head_dim": 32,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_value_head_dim": 16,
        "mamba_ssm_dtype": "float32", "max_position_embeddings": 4096, "model_type": "qwen3_5_moe_text",
        "moe_intermediate_size": 64, "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 4,
        "num_key_value_heads": 2, "output_router_logits": False, "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [1, 1, 0], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000, "rope_type": "default"},
        "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 64, "tie_word_embeddings": False,
        "use_cache": True, "vocab_size": VOCAB,
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "image_token_id": 506, "model_type": "qwen3_5_moe",
        "text_config": text, "tie_word_embeddings": False, "transformers_version": tv, "video_token_id": 507,
        "vision_config": vision_config(64, "qwen3_5_moe"), "vision_end_token_id": 505,
        "vision_start_token_id": 504,
    }


CONFIGS = {"qwen3": config_qwen3, "qwen3_moe": config_qwen3_moe, "qwen3_next": config_qwen3_next,
           "qwen3_5": config_qwen3_5, "qwen3_5_moe": config_qwen3_5_moe}
VLM_FAMILIES = ("qwen3_5", "qwen3_5_moe")
ZERO_CENTRED_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")


def text_cfg(cfg):
    return cfg["text_config"] if "text_config" in cfg else cfg


# ----------------------------------------------------------------------------------------------
# The Hub tensor layout of each family (qwen-spec §2-5, §8, §10), name -> shape.

def layer_type(fam, tc, i):
    if fam in ("qwen3", "qwen3_moe"):
        return "full_attention"
    if tc.get("layer_types"):
        return tc["layer_types"][i]
    return "full_attention" if (i + 1) % tc.get("full_attention_interval", 4) == 0 else "linear_attention"


def attn_shapes(p, gated, H, nH, nKV, hd):
    return OrderedDict([
        (p + "q_proj.weight", [nH * hd * (2 if gated else 1), H]), (p + "k_proj.weight", [nKV * hd, H]),
        (p + "v_proj.weight", [nKV * hd, H]), (p + "o_proj.weight", [H, nH * hd]),
        (p + "q_norm.weight", [hd]), (p + "k_norm.weight", [hd])])


def linear_attn_shapes(p, fam, tc):
    H, Hk, Hv = tc["hidden_size"], tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    Dk, Dv, K = tc["linear_key_head_dim"], tc["linear_value_head_dim"], tc["linear_conv_kernel_dim"]
    key_dim, value_dim = Hk * Dk, Hv * Dv
    conv_dim = 2 * key_dim + value_dim
    S = OrderedDict()
    if fam == "qwen3_next":
        S[p + "in_proj_qkvz.weight"] = [2 * key_dim + 2 * value_dim, H]
        S[p + "in_proj_ba.weight"] = [2 * Hv, H]
    else:
        S[p + "in_proj_qkv.weight"] = [conv_dim, H]
        S[p + "in_proj_z.weight"] = [value_dim, H]
        S[p + "in_proj_b.weight"] = [Hv, H]
        S[p + "in_proj_a.weight"] = [Hv, H]
    S[p + "conv1d.weight"] = [conv_dim, 1, K]
    S[p + "A_log"] = [Hv]
    S[p + "dt_bias"] = [Hv]
    S[p + "norm.weight"] = [Dv]
    S[p + "out_proj.weight"] = [H, value_dim]
    return S


def dense_mlp_shapes(p, H, I):
    return OrderedDict([(p + "gate_proj.weight", [I, H]), (p + "up_proj.weight", [I, H]),
                        (p + "down_proj.weight", [H, I])])


def moe_shapes(p, H, E, Im, Is, fused):
    S = OrderedDict([(p + "gate.weight", [E, H])])
    if fused:
        S[p + "experts.gate_up_proj"] = [E, 2 * Im, H]
        S[p + "experts.down_proj"] = [E, H, Im]
    else:
        for e in range(E):
            S.update(dense_mlp_shapes(f"{p}experts.{e}.", H, Im))
    if Is:
        S.update(dense_mlp_shapes(p + "shared_expert.", H, Is))
        S[p + "shared_expert_gate.weight"] = [1, H]
    return S


def mlp_shapes(p, fam, tc, i, mtp=False):
    H = tc["hidden_size"]
    if fam in ("qwen3", "qwen3_5"):
        return dense_mlp_shapes(p, H, tc["intermediate_size"])
    E, Im = tc["num_experts"], tc["moe_intermediate_size"]
    if fam in ("qwen3_moe", "qwen3_next") and not mtp:
        sparse = i not in tc.get("mlp_only_layers", []) and E > 0 and (i + 1) % tc.get("decoder_sparse_step", 1) == 0
        if not sparse:
            return dense_mlp_shapes(p, H, tc["intermediate_size"])
    Is = tc.get("shared_expert_intermediate_size") if fam != "qwen3_moe" else None
    # Qwen3.5-MoE main layers are fused on the Hub; its MTP layer (35B layout) and Qwen3-Next are per-expert.
    return moe_shapes(p, H, E, Im, Is, fused=(fam == "qwen3_5_moe" and not mtp))


def vision_shapes(vc, p="model.visual."):
    D, C, T, ps = vc["hidden_size"], vc["in_channels"], vc["temporal_patch_size"], vc["patch_size"]
    Iv, out, m = vc["intermediate_size"], vc["out_hidden_size"], vc["spatial_merge_size"]
    Dm = D * m * m
    S = OrderedDict([(p + "patch_embed.proj.weight", [D, C, T, ps, ps]), (p + "patch_embed.proj.bias", [D]),
                     (p + "pos_embed.weight", [vc["num_position_embeddings"], D])])
    for i in range(vc["depth"]):
        b = f"{p}blocks.{i}."
        for n, shp in (("norm1.weight", [D]), ("norm1.bias", [D]), ("norm2.weight", [D]), ("norm2.bias", [D]),
                       ("attn.qkv.weight", [3 * D, D]), ("attn.qkv.bias", [3 * D]),
                       ("attn.proj.weight", [D, D]), ("attn.proj.bias", [D]),
                       ("mlp.linear_fc1.weight", [Iv, D]), ("mlp.linear_fc1.bias", [Iv]),
                       ("mlp.linear_fc2.weight", [D, Iv]), ("mlp.linear_fc2.bias", [D])):
            S[b + n] = shp
    for n, shp in (("norm.weight", [D]), ("norm.bias", [D]), ("linear_fc1.weight", [Dm, Dm]),
                   ("linear_fc1.bias", [Dm]), ("linear_fc2.weight", [out, Dm]), ("linear_fc2.bias", [out])):
        S[p + "merger." + n] = shp
    return S


def hub_shapes(fam, cfg):
    tc = text_cfg(cfg)
    vlm = fam in VLM_FAMILIES
    P = "model.language_model." if vlm else "model."
    H, V = tc["hidden_size"], tc["vocab_size"]
    nH, nKV = tc["num_attention_heads"], tc["num_key_value_heads"]
    hd = tc.get("head_dim") or H // nH
    S = OrderedDict([(P + "embed_tokens.weight", [V, H])])
    for i in range(tc["num_hidden_layers"]):
        L = f"{P}layers.{i}."
        S[L + "input_layernorm.weight"] = [H]
        S[L + "post_attention_layernorm.weight"] = [H]
        if layer_type(fam, tc, i) == "full_attention":
            S.update(attn_shapes(L + "self_attn.", fam not in ("qwen3", "qwen3_moe"), H, nH, nKV, hd))
        else:
            S.update(linear_attn_shapes(L + "linear_attn.", fam, tc))
        S.update(mlp_shapes(L + "mlp.", fam, tc, i))
    S[P + "norm.weight"] = [H]
    if not cfg.get("tie_word_embeddings", False):
        S["lm_head.weight"] = [V, H]
    if vlm:
        S.update(vision_shapes(cfg["vision_config"]))
    return S


def mtp_shapes(fam, cfg):
    """One MTP layer (qwen-spec §8.1): pre-fc norms, fc [H, 2H], a gated full-attention layer, mtp.norm."""
    tc = text_cfg(cfg)
    H, nH, nKV, hd = tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    S = OrderedDict([("mtp.fc.weight", [H, 2 * H]), ("mtp.pre_fc_norm_embedding.weight", [H]),
                     ("mtp.pre_fc_norm_hidden.weight", [H]), ("mtp.layers.0.input_layernorm.weight", [H]),
                     ("mtp.layers.0.post_attention_layernorm.weight", [H])])
    S.update(attn_shapes("mtp.layers.0.self_attn.", True, H, nH, nKV, hd))
    S.update(mlp_shapes("mtp.layers.0.mlp.", fam, tc, 0, mtp=True))
    S["mtp.norm.weight"] = [H]
    return S


# ----------------------------------------------------------------------------------------------
# Seeded random weights (GOLDEN.md scales): per-tensor seed from the name, independent of order.

def norm_module(name):
    parts = name.split(".")
    return len(parts) >= 2 and parts[-1] == "weight" and "norm" in parts[-2]


def is_zero_centred_norm(fam, name):
    """Norms stored as w and applied as (1 + w): Qwen3-Next / Qwen3.5 text and MTP norms, not the
    linear-attention gated norm, not the vision LayerNorms."""
    if fam not in ZERO_CENTRED_FAMILIES or not norm_module(name):
        return False
    if name.startswith(("model.visual.", "vision_tower.")) or name.endswith("linear_attn.norm.weight"):
        return False
    return True


def init_tensor(fam, fixture_seed, name, shape, tied):
    rng = np.random.default_rng([SEED, fixture_seed, zlib.crc32(name.encode())])

    def normal(std):
        return rng.standard_normal(shape) * std

    if name.endswith("A_log"):
        v = np.log(rng.uniform(0.3, 3.0, shape))          # decay exp(-A*softplus(.)) spans ~0.01..0.95
    elif name.endswith("dt_bias"):
        v = rng.normal(-0.5, 0.5, shape)
    elif len(shape) == 1 and name.endswith(".bias"):
        v = normal(0.1)
    elif len(shape) == 1 and norm_module(name):
        v = (0.0 if is_zero_centred_norm(fam, name) else 1.0) + normal(0.1)
    elif name.endswith("embed_tokens.weight"):
        # Tied: the head reads the residual through the final RMSNorm, so only embedding : layer-output
        # scale matters; at 0.3 greedy echoes its last token, at 0.1 it does not (logit std ~0.8).
        v = normal(0.1 if tied else 1.0)
    elif name.endswith("pos_embed.weight"):
        v = normal(0.5)
    elif name.endswith("lm_head.weight"):
        v = normal(2.0 / math.sqrt(shape[-1]))
    elif name.endswith(("experts.gate_up_proj", "experts.down_proj")):
        v = normal(1.0 / math.sqrt(shape[-1]))
    elif len(shape) >= 2:
        v = normal(1.0 / math.sqrt(int(np.prod(shape[1:]))))
    else:
        raise ValueError(f"no init rule for {name} {shape}")
    return bf16_round(np.asarray(v, dtype=np.float32))


def random_tensors(fam, fixture_seed, shapes, tied=False):
    return OrderedDict((n, init_tensor(fam, fixture_seed, n, s, tied)) for n, s in shapes.items())


# ----------------------------------------------------------------------------------------------
# Hub layout <-> transformers in-memory layout (v5 keeps experts as fused 3-D parameters).

def expected_memory_state(fam, cfg, hub):
    """What transformers should hold after loading `hub`: per-expert tensors fused into
    experts.gate_up_proj [E, 2I, H] (gate rows then up rows) and experts.down_proj [E, H, I]; tied head."""
    out = OrderedDict((k, as_f32(v)) for k, v in hub.items() if not k.startswith("mtp."))
    groups = {}
    for k in list(out):
        parts = k.split(".")
        if len(parts) >= 5 and parts[-4] == "experts" and parts[-3].isdigit():
            base = ".".join(parts[:-3])
            groups.setdefault(base, {})[(int(parts[-3]), parts[-2])] = k
    for base, g in groups.items():
        E = 1 + max(e for e, _ in g)
        gu = np.stack([np.concatenate([out[g[(e, "gate_proj")]], out[g[(e, "up_proj")]]], axis=0) for e in range(E)])
        dn = np.stack([out[g[(e, "down_proj")]] for e in range(E)])
        out[base + ".gate_up_proj"] = gu
        out[base + ".down_proj"] = dn
    if cfg.get("tie_word_embeddings", False):
        P = "model.language_model." if fam in VLM_FAMILIES else "model."
        out["lm_head.weight"] = out[P + "embed_tokens.weight"]
    return out


# ----------------------------------------------------------------------------------------------
# MLX conversions (qwen-spec §5, §7, §9), numpy only.

def mlx_shifted_norm(name, arr):
    """Zero-centred norms that mlx-lm stores as 1 + w (text, model norm, q/k norms, every MTP norm)."""
    return arr.ndim == 1 and name.startswith("language_model.") and is_zero_centred_norm("qwen3_5", name)


def hf_to_mlx_name(k, vlm=True):
    if not vlm:
        return k                  # mlx-lm's qwen3 / qwen3_moe use the HF names
    if k.startswith("model.visual."):
        return "vision_tower." + k[len("model.visual."):]
    if k.startswith("model.language_model."):
        return "language_model.model." + k[len("model.language_model."):]
    return "language_model." + k


def mlx_to_hf_name(k, vlm=True):
    if not vlm:
        return k
    if k.startswith("vision_tower."):
        return "model.visual." + k[len("vision_tower."):]
    if k.startswith("language_model.model."):
        return "model.language_model." + k[len("language_model.model."):]
    assert k.startswith("language_model."), k
    return k[len("language_model."):]


def to_mlx(hub, keep_mtp, vlm=True):
    """mlx-lm/mlx-vlm convert of a Qwen3.5(-MoE) HF checkpoint (bf16 in, bf16 out); with vlm=False, the
    text-only Qwen3 convert (names unchanged, plain norms)."""
    out = OrderedDict()
    for k, v in hub.items():
        if k.startswith("mtp.") and not keep_mtp:
            continue
        nk = hf_to_mlx_name(k, vlm)
        if nk.endswith("patch_embed.proj.weight"):
            v = np.ascontiguousarray(v.transpose(0, 2, 3, 4, 1))     # [out, C, T, h, w] -> [out, T, h, w, C]
        if "conv1d.weight" in nk:
            v = np.ascontiguousarray(v.transpose(0, 2, 1))           # [C, 1, K] -> [C, K, 1]
        if mlx_shifted_norm(nk, v):
            v = bf16_round(bf16_to_f32(v) + np.float32(1.0))         # gamma = 1 + w in fp32, rounded to bf16
        out[nk] = v
    for nk in [k for k in out if k.endswith(".mlp.experts.gate_up_proj")]:
        base = nk[:-len("experts.gate_up_proj")]
        gu = out.pop(nk)
        mid = gu.shape[-2] // 2
        out[base + "switch_mlp.gate_proj.weight"] = np.ascontiguousarray(gu[..., :mid, :])
        out[base + "switch_mlp.up_proj.weight"] = np.ascontiguousarray(gu[..., mid:, :])
        out[base + "switch_mlp.down_proj.weight"] = out.pop(base + "experts.down_proj")
    return out


def mlx_quantize_model(mlx, mode="affine", bits=4, group=MLX_GROUP):
    """mlx-lm quantize_model: every Linear / SwitchLinear / Embedding of the language model (not the vision
    tower, not conv1d) whose in-dim is a multiple of the group. Affine: router and shared_expert_gate at
    8 bits as per-module overrides; scales/biases bf16. mxfp4: uint8 E8M0 scales, no biases."""
    qcfg = OrderedDict([("group_size", group), ("bits", bits), ("mode", mode)])
    out, qinfo = OrderedDict(), {}
    for k, v in mlx.items():
        module = k[:-len(".weight")] if k.endswith(".weight") else None
        if not (module and not k.startswith("vision_tower.") and v.ndim >= 2 and "conv1d" not in k
                and v.shape[-1] % group == 0):
            out[k] = v
            continue
        if mode == "mxfp4":
            wq, s, q = mxfp4_quantize(bf16_to_f32(v), group)
            out[k] = wq
            out[module + ".scales"] = s
            qinfo[module] = (4, q)
            continue
        b = bits
        if module.endswith((".mlp.gate", ".mlp.shared_expert_gate")):
            b = 8
            qcfg[module] = {"group_size": group, "bits": 8}
        wq, s, bias, q = mlx_affine_quantize(bf16_to_f32(v), group, b)
        out[k] = wq
        out[module + ".scales"] = bf16_round(s)
        out[module + ".biases"] = bf16_round(bias)
        qinfo[module] = (b, q)
    return out, qcfg, qinfo


def mlx_dequantize_module(mlx, module, qcfg):
    """fp32 value of a quantized module's weight from what the checkpoint stores."""
    o = qcfg.get(module, {})
    gs, bits = o.get("group_size", qcfg["group_size"]), o.get("bits", qcfg["bits"])
    if qcfg.get("mode", "affine") == "mxfp4":
        return mxfp4_dequantize(mlx[module + ".weight"], mlx[module + ".scales"], gs)
    return mlx_dequantize(mlx[module + ".weight"], mlx[module + ".scales"], mlx[module + ".biases"], gs, bits)


def mlx_to_hf(mlx, qcfg=None, vlm=True):
    """Map an MLX checkpoint back to HF names/layout in fp32: dequantize, gamma - 1, conv and patch
    embedding back, switch_mlp fused back into experts.gate_up_proj / down_proj."""
    hf = OrderedDict()
    for k, v in mlx.items():
        if k.endswith((".scales", ".biases")):
            continue
        module = k[:-len(".weight")]
        x = mlx_dequantize_module(mlx, module, qcfg) if v.dtype == np.uint32 else as_f32(v)
        if mlx_shifted_norm(k, x):
            x = (x - np.float32(1.0)).astype(np.float32)
        if "conv1d.weight" in k:
            x = np.ascontiguousarray(x.transpose(0, 2, 1))
        if k.endswith("patch_embed.proj.weight"):
            x = np.ascontiguousarray(x.transpose(0, 4, 1, 2, 3))
        hf[mlx_to_hf_name(k, vlm)] = x
    for k in [k for k in hf if k.endswith(".mlp.switch_mlp.gate_proj.weight")]:
        base = k[:-len("switch_mlp.gate_proj.weight")]
        gate, up = hf.pop(k), hf.pop(base + "switch_mlp.up_proj.weight")
        hf[base + "experts.gate_up_proj"] = np.ascontiguousarray(np.concatenate([gate, up], axis=-2))
        hf[base + "experts.down_proj"] = hf.pop(base + "switch_mlp.down_proj.weight")
    return hf


# ----------------------------------------------------------------------------------------------
# Prompts

def make_prompts():
    rng = np.random.default_rng([SEED, 7])
    prompts = [[int(t) for t in rng.integers(0, PROMPT_TOKEN_LIMIT, n)] for n in PROMPT_LENGTHS]
    prompts[1][3] = 0      # token 0 is not padding: one prompt must contain it
    return prompts


# ----------------------------------------------------------------------------------------------
# transformers side (runs on the machine with torch + transformers)

LOG = []


def log(msg=""):
    print(msg, flush=True)
    LOG.append(str(msg))


def maxdiff(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def write_json(path, obj, indent=2, sort_keys=False):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent, sort_keys=sort_keys)
        f.write("\n")


def load_hf(dirpath, arch):
    cls = getattr(transformers, arch)
    model, info = cls.from_pretrained(dirpath, dtype=torch.float32, output_loading_info=True)
    model.eval()
    if not isinstance(info, dict):
        info = dict(getattr(info, "__dict__", {}))
    info = {k: sorted(str(x) for x in v) for k, v in info.items() if isinstance(v, (list, set, tuple, dict))}
    return model, info


def check_loading_info(info, allow_unexpected_prefix=None):
    """Shape mismatches, errors and unexpected keys fail; missing keys are caught by compare_state,
    which checks every loaded parameter against the checkpoint."""
    missing = info.get("missing_keys", [])
    mismatched = info.get("mismatched_keys", [])
    unexpected = [k for k in info.get("unexpected_keys", [])
                  if not (allow_unexpected_prefix and k.startswith(allow_unexpected_prefix))]
    errors = info.get("error_msgs", [])
    if missing:
        log(f"    loader reports missing keys: {missing[:8]}")
    if mismatched or unexpected or errors:
        raise RuntimeError(f"load problems: mismatched={mismatched[:8]} unexpected={unexpected[:8]} "
                           f"errors={errors[:4]}")


def compare_state(model, expected):
    """Every parameter transformers loaded must equal what the checkpoint says (buffers: reported only)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    worst, unverified = 0.0, []
    for k, t in model.state_dict().items():
        if k not in expected:
            if k in params:
                unverified.append(f"{k}{list(t.shape)}")
            else:
                log(f"    buffer not in checkpoint (not compared): {k}{list(t.shape)}")
            continue
        e = expected[k]
        if list(t.shape) != list(e.shape):
            raise RuntimeError(f"{k}: loaded shape {list(t.shape)} != expected {list(e.shape)}")
        worst = max(worst, maxdiff(t.detach().float().numpy(), e))
    not_loaded = [k for k in expected if k not in model.state_dict()]
    return worst, unverified, not_loaded


def official_reader_check(dirpath, tensors):
    """Read the hand-written files back with the safetensors library itself."""
    from safetensors import safe_open
    seen = {}
    for f in sorted(os.listdir(dirpath)):
        if not f.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(dirpath, f), framework="pt") as sf:
            for k in sf.keys():
                t = sf.get_tensor(k)
                if t.dtype == torch.bfloat16:
                    seen[k] = t.view(torch.int16).numpy().view(np.uint16)
                elif t.dtype in (torch.float32, torch.uint8):
                    seen[k] = t.numpy()
                else:
                    seen[k] = t.view(torch.int32).numpy().view(np.uint32)
    bad = sorted(k for k in tensors if k not in seen or seen[k].dtype != tensors[k].dtype
                 or not np.array_equal(seen[k], tensors[k]))
    if bad or set(seen) != set(tensors):
        raise RuntimeError(f"safetensors library reads back something else: {bad[:5]} "
                           f"{sorted(set(seen) ^ set(tensors))[:5]}")


def forward_logits(model, ids, **extra):
    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=False, **extra)
    return out.logits[0].float()


def greedy_with_margins(model, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(torch.argmax(forward_logits(model, seq)[-1])))
    gen = seq[len(prompt):]
    tf = forward_logits(model, seq)          # teacher-forced over prompt + greedy tokens
    margins, flips = [], []
    for i in range(n):
        row = tf[len(prompt) - 1 + i]
        top = torch.topk(row, 2).values
        margins.append(float(top[0] - top[1]))
        if int(torch.argmax(row)) != gen[i]:
            flips.append(i)
    return gen, margins, flips


def generate_cached(model, prompt, n):
    x = torch.tensor([prompt], dtype=torch.long)
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=511)
    return [int(t) for t in out[0, len(prompt):]]


def compute_reference(model, prompts):
    ref = {"logits": [], "greedy": [], "greedy_margins": [], "generate_cached_matches": []}
    for k, p in enumerate(prompts):
        lg = forward_logits(model, p)
        ref["logits"].append(lg.numpy().astype(np.float32))
        gen, margins, flips = greedy_with_margins(model, p, N_GREEDY)
        if flips:
            log(f"    prompt {k}: teacher-forced argmax differs from greedy at steps {flips} "
                f"(margins {[round(margins[i], 6) for i in flips]})")
        ref["greedy"].append(gen)
        ref["greedy_margins"].append(margins)
        try:
            cached = generate_cached(model, p, N_GREEDY)
            ref["generate_cached_matches"].append(cached == gen)
            if cached != gen:
                log(f"    prompt {k}: generate() (KV/recurrent cache) {cached} != recompute greedy {gen}")
        except Exception as e:  # diagnostic only
            ref["generate_cached_matches"].append(None)
            log(f"    prompt {k}: generate() failed: {type(e).__name__}: {e}")
    return ref


def write_reference(outdir, name, fam, cfg, prompts, ref, notes, extra=None):
    files, shapes = [], []
    for k, lg in enumerate(ref["logits"]):
        fn = f"logits_{k}.bin"
        with open(os.path.join(outdir, fn), "wb") as f:
            f.write(np.ascontiguousarray(lg, dtype="<f4").tobytes())
        files.append(fn)
        shapes.append(list(lg.shape))
    doc = OrderedDict([
        ("fixture", name), ("family", fam), ("model_type", cfg["model_type"]),
        ("architecture", cfg["architectures"][0]), ("transformers", transformers.__version__),
        ("torch", torch.__version__), ("seed", SEED), ("format", "hf"), ("prompts", prompts), ("logits", files),
        ("shape", shapes), ("logits_dtype", "float32 little-endian, row-major [L, V]"),
        ("greedy", ref["greedy"]), ("greedy_margins", ref["greedy_margins"]),
        ("generate_cached_matches", ref["generate_cached_matches"]), ("notes", notes)])
    if extra:
        doc.update(extra)
    with open(os.path.join(outdir, "reference.json"), "w") as f:     # one key per line, lists inline
        f.write("{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items()) + "\n}\n")


def investigate_save_pretrained(model, hub, fixture_dir, work):
    """What transformers' own save_pretrained writes for this model (tensor names/shapes, config.json)."""
    tmp = os.path.join(work, "saved")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp)
    from safetensors import safe_open
    saved = {}
    for f in sorted(os.listdir(tmp)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(tmp, f), framework="pt") as sf:
                for k in sf.keys():
                    saved[k] = sf.get_tensor(k)
    ref = {k: v for k, v in hub.items() if not k.startswith("mtp.")}
    only_saved = sorted(set(saved) - set(ref))
    only_hub = sorted(set(ref) - set(saved))
    shape_diff = [k for k in set(saved) & set(ref) if list(saved[k].shape) != list(ref[k].shape)]
    value_diff = [k for k in set(saved) & set(ref) if k not in shape_diff and
                  maxdiff(saved[k].float().numpy(), as_f32(ref[k])) != 0.0]
    log(f"    save_pretrained: files {sorted(os.listdir(tmp))}")
    log(f"    save_pretrained: {len(saved)} tensors; only in save_pretrained: {len(only_saved)} {only_saved[:6]}; "
        f"only in hub layout: {len(only_hub)} {only_hub[:6]}; shape differs: {shape_diff[:6]}; "
        f"value differs: {value_diff[:6]}")
    shutil.copy(os.path.join(tmp, "config.json"), os.path.join(fixture_dir, "hf_saved_config.json"))
    with open(os.path.join(tmp, "config.json")) as f:
        log("    save_pretrained config.json: " + json.dumps(json.load(f), sort_keys=True))


def add_image_reference(model, cfg, prompts):
    """Qwen3.5 with one image: grid (1, 4, 6) -> 24 patches -> 6 merged tokens."""
    rng = np.random.default_rng([SEED, 11])
    grid = [1, 4, 6]
    vc = cfg["vision_config"]
    patch_dim = vc["in_channels"] * vc["temporal_patch_size"] * vc["patch_size"] ** 2
    n_patches = grid[0] * grid[1] * grid[2]
    n_tokens = n_patches // vc["spatial_merge_size"] ** 2
    pixels = rng.uniform(-1.0, 1.0, (n_patches, patch_dim)).astype(np.float32)
    ids = prompts[0][:5] + [cfg["vision_start_token_id"]] + [cfg["image_token_id"]] * n_tokens + \
        [cfg["vision_end_token_id"]] + prompts[0][2:7]
    mm = [1 if t == cfg["image_token_id"] else 0 for t in ids]
    x = torch.tensor([ids], dtype=torch.long)
    pv = torch.from_numpy(pixels)
    thw = torch.tensor([grid], dtype=torch.long)
    with torch.no_grad():
        feats = model.model.get_image_features(pixel_values=pv, image_grid_thw=thw)
        feats = feats.pooler_output if hasattr(feats, "pooler_output") else feats
        if isinstance(feats, (list, tuple)):
            feats = torch.cat(list(feats), dim=0)
        out = model(input_ids=x, attention_mask=torch.ones_like(x), pixel_values=pv, image_grid_thw=thw,
                    mm_token_type_ids=torch.tensor([mm], dtype=torch.int32), use_cache=False)
    model.model.rope_deltas = None
    logits = out.logits[0].float().numpy()
    feats = feats.float().numpy()
    arrays = {"image_pixel_values.bin": pixels, "image_features.bin": feats, "image_logits.bin": logits}
    log(f"    image reference: ids {len(ids)}, features {list(feats.shape)}, logits {list(logits.shape)}")
    return arrays, {"image": OrderedDict([
        ("input_ids", ids), ("mm_token_type_ids", mm), ("image_grid_thw", [grid]),
        ("pixel_values", "image_pixel_values.bin"), ("pixel_values_shape", list(pixels.shape)),
        ("image_features", "image_features.bin"), ("image_features_shape", list(feats.shape)),
        ("logits", "image_logits.bin"), ("shape", list(logits.shape)),
        ("notes", "pixel_values are already patch-flattened as the Qwen2/3-VL processor emits them "
                  "(row order t, h/2, w/2, dh, dw; vector order C, T, ph, pw); image_features = merger output.")])}


FIXTURE_SEEDS = {"qwen3": 1, "qwen3_moe": 2, "qwen3_next": 3, "qwen3_5": 4, "qwen3_5_moe": 5}

# A family's fixture with a few config keys changed: its weights (same seed), config, and notes.
HF_VARIANTS = OrderedDict([
    # YaRN by 4 over a 32-position original context: the 80-token prompt runs far past it. With
    # max_position_embeddings = factor x original, transformers 4.x (which takes factor = max / original)
    # and 5.x (the explicit factor) compute the same frequencies, and 5.x warns of no mismatch.
    ("qwen3_yarn", dict(
        src="qwen3",
        config={"max_position_embeddings": 128,
                "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}},
        notes=" The qwen3 fixture's weights with YaRN rotary scaling (factor 4 over 32 original positions, "
              "max_position_embeddings 128): most frequencies divided by 4, cos and sin scaled by 0.1 ln 4 + 1. "
              "reference.json's rope holds the rotary embedding's inv_freq and attention_scaling as loaded.")),
])


def yarn_inv_freq(dim, base, factor, original, beta_fast=32, beta_slow=1, truncate=True):
    """transformers 5's _compute_yarn_parameters in numpy: Python floats where it uses them, float32 arrays
    where torch computes in float32 (each operation rounded on its own). The powers are rounded correctly, as
    glibc's powf (qinfer's) rounds them; torch's vectorized pow and numpy's may be an ulp off."""
    f32 = np.float32

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=f32) - f32(low)) / f32(high - low), f32(0), f32(1))
    exponents = np.arange(0, dim, 2).astype(f32) / f32(dim)
    pos_freqs = np.array([math.pow(float(f32(base)), float(e)) for e in exponents], dtype=f32)
    extrapolation = f32(1) / pos_freqs
    interpolation = f32(1) / (f32(factor) * pos_freqs)
    keep = f32(1) - ramp
    return (interpolation * (f32(1) - keep) + extrapolation * keep).astype(f32)


def rotary_embedding(model):
    for m in model.modules():
        if type(m).__name__.endswith("RotaryEmbedding") and hasattr(m, "inv_freq"):
            return m
    raise RuntimeError("no rotary embedding module in the model")


def yarn_reference(model, cfg):
    """The rotary frequencies transformers uses, checked against yarn_inv_freq and the attention factor."""
    rope = rotary_embedding(model)
    inv_freq = rope.inv_freq.detach().float().cpu().numpy()
    scaling = float(rope.attention_scaling)
    rs = cfg["rope_scaling"]
    mine = yarn_inv_freq(cfg["head_dim"], cfg["rope_theta"], rs["factor"], rs["original_max_position_embeddings"])
    ulps = np.abs(inv_freq.view(np.int32).astype(np.int64) - mine.view(np.int32).astype(np.int64))
    log(f"    rotary embedding {type(rope).__name__}: rope_type {getattr(rope, 'rope_type', '?')}, attention_scaling "
        f"{scaling!r}; inv_freq vs the numpy transcription: {int(np.count_nonzero(ulps))} of {ulps.size} differ, "
        f"at most {int(ulps.max())} ulp")
    if ulps.max() > 4 or abs(scaling - (0.1 * math.log(rs["factor"]) + 1.0)) > 1e-12:
        raise RuntimeError("transformers' YaRN frequencies are not the expected ones")
    return {"rope": OrderedDict([("rope_type", "yarn"), ("inv_freq", [float(v) for v in inv_freq]),
                                 ("attention_scaling", scaling)])}


def make_hf_fixture(name, out, work, prompts, tv, state):
    variant = HF_VARIANTS.get(name)
    fam = variant["src"] if variant else name
    cfg = CONFIGS[fam](tv)
    if variant:
        cfg.update(variant["config"])
    arch = cfg["architectures"][0]
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    write_json(os.path.join(d, "config.json"), cfg, sort_keys=True)
    shapes = hub_shapes(fam, cfg)
    hub = random_tensors(fam, FIXTURE_SEEDS[fam], shapes, tied=cfg.get("tie_word_embeddings", False))
    shards = 2 if fam == "qwen3_moe" else 1
    files = write_checkpoint(d, hub, shards=shards)
    log(f"  {name}: {len(hub)} tensors, {sum(v.nbytes for v in hub.values())} bytes in {files}")

    model, info = load_hf(d, arch)
    log(f"    loading info: { {k: len(v) for k, v in info.items()} }")
    check_loading_info(info)
    expected = expected_memory_state(fam, cfg, hub)
    worst, unverified, not_loaded = compare_state(model, expected)
    log(f"    loaded parameters vs checkpoint: max abs diff {worst}; not in checkpoint: {unverified[:8]}; "
        f"checkpoint-derived keys not in model: {not_loaded[:8]}")
    if worst != 0.0 or unverified:
        for k, t in list(model.state_dict().items())[:40]:
            log(f"      model has {k} {list(t.shape)}")
        raise RuntimeError("transformers did not load exactly what the checkpoint holds")
    mem_keys = sorted(k for k in model.state_dict() if k not in hub)
    if mem_keys:
        log(f"    in-memory names that differ from the hub layout: {mem_keys[:6]}")

    ref = compute_reference(model, prompts)
    extra, arrays = {}, {}
    if (cfg.get("rope_scaling") or {}).get("rope_type") == "yarn":
        extra.update(yarn_reference(model, cfg))
    if fam == "qwen3_5":
        try:
            arrays, extra = add_image_reference(model, cfg, prompts)
        except Exception as e:
            log(f"    image reference FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()

    notes = ("Random bf16 weights (seeded), stored in the Hugging Face Hub layout of the family; logits computed "
             "in fp32 by transformers from the stored bf16 values (from_pretrained dtype=float32, "
             "attention_mask of ones, use_cache=False). greedy = argmax re-running the full sequence each step; "
             "greedy_margins[i] = top1 - top2 logit at the step that produced greedy[i], from one teacher-forced "
             "pass over prompt + greedy tokens.")
    if variant:
        notes += variant["notes"]
    if fam in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        mtp = random_tensors(fam, FIXTURE_SEEDS[fam] + 100, mtp_shapes(fam, cfg))
        hub.update(mtp)
        for f in files:
            os.remove(os.path.join(d, f))
        files = write_checkpoint(d, hub, shards=shards)
        model2, info2 = load_hf(d, arch)
        check_loading_info(info2, allow_unexpected_prefix="mtp.")
        dmax = max(maxdiff(forward_logits(model2, p).numpy(), ref["logits"][k]) for k, p in enumerate(prompts))
        log(f"    added {len(mtp)} mtp.* tensors; reload: unexpected keys {len(info2.get('unexpected_keys', []))}, "
            f"logits max abs diff vs reference {dmax}")
        if dmax > 1e-5:
            raise RuntimeError("mtp tensors changed the logits")
        notes += (" The mtp.* tensors (random, qwen-spec §8.1) were added after the reference was computed; "
                  "transformers ignores them (reload gives identical logits).")
        del model2
    official_reader_check(d, hub)
    write_reference(d, name, fam, cfg, prompts, ref, notes, extra)
    for fn, arr in arrays.items():
        with open(os.path.join(d, fn), "wb") as f:
            f.write(np.ascontiguousarray(arr, dtype="<f4").tobytes())

    try:
        investigate_save_pretrained(model, hub, d, os.path.join(work, name))
    except Exception as e:
        log(f"    save_pretrained investigation failed: {type(e).__name__}: {e}")
    state[name] = {"cfg": cfg, "hub": hub, "ref": ref}


MLX_CONVERT_NOTE = ("The {src} fixture converted as mlx-lm/mlx-vlm convert does: language_model.* / vision_tower.* "
                    "names, zero-centred norms stored as 1 + w (fp32 add, rounded to bf16; linear_attn.norm not "
                    "shifted), conv1d [C, K, 1], patch_embed [out, T, h, w, C]")
AFFINE_REFERENCE_NOTE = " Reference: transformers on the dequantized weights (scale*q + bias in fp32)."


def qwen3_5_affine_note(bits):
    return (MLX_CONVERT_NOTE + f", mtp dropped, affine quantized (group 64, {bits} bits; every Linear of the "
            "language model and the embedding; q packed as an LSB-first bitstream in uint32 words (element j at "
            f"bits [{bits}j, {bits}j + {bits})), so values straddle words; bf16 scales/biases; vision tower bf16)."
            + AFFINE_REFERENCE_NOTE)


# name -> source fixture, quantization (mode, bits, group) or None, layout, quant_check tensors, notes.
MLX_FIXTURES = OrderedDict([
    ("qwen3_5_mlx", dict(
        src="qwen3_5", quant=None, vlm=True, picks=[],
        notes=MLX_CONVERT_NOTE + ", mtp kept as language_model.mtp.* (also shifted). Reference: transformers on "
                                 "gamma - 1 (fp32).")),
    ("qwen3_5_moe_mlx_4bit", dict(
        src="qwen3_5_moe", quant=("affine", 4, MLX_GROUP), vlm=True,
        picks=["language_model.model.embed_tokens", "language_model.model.layers.0.mlp.switch_mlp.down_proj",
               "language_model.model.layers.3.mlp.gate"],
        notes=MLX_CONVERT_NOTE + ", experts stacked as switch_mlp, mtp dropped, affine quantized (group 64, 4 bits; "
                                 "mlp.gate and shared_expert_gate 8 bits; q packed LSB-first in uint32; bf16 "
                                 "scales/biases; vision tower bf16)." + AFFINE_REFERENCE_NOTE)),
    ("qwen3_mlx_8bit", dict(
        src="qwen3", quant=("affine", 8, MLX_GROUP), vlm=False,
        picks=["model.embed_tokens", "model.layers.0.self_attn.o_proj", "model.layers.2.mlp.down_proj"],
        notes="The qwen3 fixture converted as mlx-lm convert does (Qwen3's MLX names equal the HF names; tied, so "
              "no lm_head: the QuantizedEmbedding's packed weight is also the head), affine quantized (group 64, "
              "8 bits; every Linear and the embedding; q packed LSB-first in uint32; bf16 scales/biases; norms "
              "bf16)." + AFFINE_REFERENCE_NOTE)),
    ("qwen3_5_mlx_6bit", dict(
        src="qwen3_5", quant=("affine", 6, MLX_GROUP), vlm=True,
        picks=["language_model.model.embed_tokens", "language_model.model.layers.0.linear_attn.in_proj_qkv",
               "language_model.model.layers.3.mlp.down_proj"],
        notes=qwen3_5_affine_note(6))),
    ("qwen3_5_mlx_3bit", dict(
        src="qwen3_5", quant=("affine", 3, MLX_GROUP), vlm=True,
        picks=["language_model.model.embed_tokens", "language_model.model.layers.0.linear_attn.in_proj_qkv",
               "language_model.model.layers.3.mlp.down_proj"],
        notes=qwen3_5_affine_note(3))),
    ("qwen3_5_mlx_mxfp4", dict(
        src="qwen3_5", quant=("mxfp4", 4, MXFP4_GROUP), vlm=True,
        picks=["language_model.model.embed_tokens", "language_model.model.layers.0.linear_attn.in_proj_qkv",
               "language_model.lm_head"],
        notes=MLX_CONVERT_NOTE + ", mtp dropped, mxfp4 quantized (group 32; every Linear of the language model and "
                                 "the embedding; E2M1 codes 8 per uint32, element i in bits [4i, 4i + 4); uint8 "
                                 "E8M0 scales, no biases; scale exponent e = round(log2(max|w| / 6)) stored as "
                                 "127 + e clamped to [0, 254], code = E2M1 of w / 2^e rounded to nearest even, "
                                 "saturating at 6; vision tower bf16). Reference: transformers on the dequantized "
                                 "weights (lut[q] * 2^(s - 127) in fp32).")),
])


def make_mlx_fixture(name, out, work, prompts, state):
    spec = MLX_FIXTURES[name]
    src, quant, vlm = spec["src"], spec["quant"], spec["vlm"]
    s = state[src]
    cfg, hub = s["cfg"], s["hub"]
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    mlx = to_mlx(hub, keep_mtp=quant is None, vlm=vlm)
    mcfg = json.loads(json.dumps(cfg))
    mcfg.pop("_name_or_path", None)
    qcfg, qinfo = None, {}
    if quant:
        mode, bits, group = quant
        mlx, qcfg, qinfo = mlx_quantize_model(mlx, mode, bits, group)
        mcfg["quantization"] = qcfg
        mcfg["quantization_config"] = qcfg
    write_json(os.path.join(d, "config.json"), dict(sorted(mcfg.items())), indent=4)
    write_checkpoint(d, mlx, fmt="mlx", index=True)
    back, _ = read_safetensors(os.path.join(d, "model.safetensors"))
    assert set(back) == set(mlx) and all(back[k].dtype == mlx[k].dtype and np.array_equal(back[k], mlx[k])
                                         for k in mlx), "mlx file roundtrip"
    official_reader_check(d, mlx)
    log(f"  {name}: {len(mlx)} tensors, {sum(v.nbytes for v in mlx.values())} bytes"
        + (f", {len(qinfo)} quantized" if quant else ""))

    # Reference from this fixture's own stored values, mapped back to the HF layout in fp32.
    hf = mlx_to_hf(mlx, qcfg, vlm)
    base = {k: v for k, v in hub.items() if k in hf}
    if not quant:
        for k, v in base.items():
            if not np.array_equal(hf[k], as_f32(v)) and not is_zero_centred_norm("qwen3_5", k):
                raise RuntimeError(f"mlx roundtrip changed {k}")
        log(f"    mlx->hf roundtrip: non-norm tensors identical; norms max |(1+w)_bf16 - 1 - w| = "
            f"{max(maxdiff(hf[k], as_f32(v)) for k, v in base.items() if is_zero_centred_norm('qwen3_5', k))}")
    else:
        if set(hf) != set(k for k in hub if not k.startswith("mtp.")):
            raise RuntimeError(f"mapped-back names differ from {src}: {sorted(set(hf) ^ set(hub))[:6]}")
        rel = {k: float(np.sqrt(np.mean((hf[k] - as_f32(v)) ** 2) / np.mean(as_f32(v) ** 2)))
               for k, v in base.items() if hf[k].ndim >= 2 and not np.array_equal(hf[k], as_f32(v))}
        top = sorted(rel.items(), key=lambda kv: -kv[1])[:3]
        log(f"    {quant[0]} {quant[1]}-bit dequant vs bf16 source: {len(rel)} tensors changed, relative RMS error "
            f"median {float(np.median(list(rel.values()))):.4f}, worst {[(k, round(v, 4)) for k, v in top]}")
        for module, (bits, q) in qinfo.items():
            if not np.array_equal(unpack_bits(mlx[module + ".weight"], bits), q):
                raise RuntimeError(f"unpack(pack(q)) != q for {module}")
        log(f"    unpack(pack(q)) == q for all {len(qinfo)} quantized modules")
        if quant[0] == "mxfp4":
            stats = {}
            for module in qinfo:
                for key, n in mxfp4_mlx_differences(as_f32(base[mlx_to_hf_name(module + ".weight", vlm)])).items():
                    stats[key] = stats.get(key, 0) + n
            log(f"    mxfp4 vs other MLX quantizers (same weights): {stats}")
        write_quant_check(d, mlx, qcfg, spec["picks"])
    tmp = os.path.join(work, name, "hf_fp32")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    write_json(os.path.join(tmp, "config.json"), cfg, sort_keys=True)
    write_checkpoint(tmp, {k: v.astype(np.float32) for k, v in hf.items()})
    model, info = load_hf(tmp, cfg["architectures"][0])
    check_loading_info(info, allow_unexpected_prefix="mtp.")
    worst, unverified, _ = compare_state(model, expected_memory_state(src, cfg, hf))
    if worst != 0.0 or unverified:
        raise RuntimeError(f"mapped-back weights not loaded exactly (diff {worst}, {unverified[:4]})")
    ref = compute_reference(model, prompts)
    dsrc = max(maxdiff(a, b) for a, b in zip(ref["logits"], s["ref"]["logits"]))
    same = sum(a == b for g, h in zip(ref["greedy"], s["ref"]["greedy"]) for a, b in zip(g, h))
    log(f"    logits max abs diff vs {src} (norm rounding{' + quantization' if quant else ''}): {dsrc}; greedy "
        f"tokens equal to {src}'s: {same}/{N_GREEDY * len(prompts)}; min greedy margin "
        f"{min(min(m) for m in ref['greedy_margins']):.5f}")
    notes = spec["notes"].format(src=src) + " Logits, greedy and margins computed as in the HF fixtures."
    write_reference(d, name, src, cfg, prompts, ref, notes, {"source_fixture": src, "format": "mlx"})


def write_quant_check(d, mlx, qcfg, picks):
    """The first packed words, codes, group scale (and bias) and dequantized values of a few tensors."""
    fp = qcfg.get("mode", "affine") == "mxfp4"
    entries = []
    for module in picks:
        o = qcfg.get(module, {})
        bits, gs = o.get("bits", qcfg["bits"]), o.get("group_size", qcfg["group_size"])
        wq, sc = mlx[module + ".weight"], mlx[module + ".scales"]
        deq = mlx_dequantize_module(mlx, module, qcfg).reshape(-1)
        e = OrderedDict([("tensor", module + ".weight"), ("bits", bits), ("group_size", gs),
                         ("packed_shape", list(wq.shape)), ("first_words", [int(x) for x in wq.reshape(-1)[:4]]),
                         ("first_q", [int(x) for x in unpack_bits(wq, bits).reshape(-1)[:16]])])
        if fp:
            e["first_scale_e8m0"] = int(sc.reshape(-1)[0])
            e["first_scale"] = float(e8m0_value(sc).reshape(-1)[0])
        else:
            e["first_scale"] = float(bf16_to_f32(sc).reshape(-1)[0])
            e["first_bias"] = float(bf16_to_f32(mlx[module + ".biases"]).reshape(-1)[0])
        e["first_dequantized"] = [float(x) for x in deq[:16]]
        entries.append(e)
    if fp:
        note = ("dequantized = lut[q] * 2^(scale - 127) (fp32), lut = E2M1 {0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, ..., "
                "-6}; q = 4-bit codes, element i in bits [4i, 4i + 4) of the row's words (low nibble first); "
                "row-major flat order of the unpacked [..., out, in] weight")
    else:
        note = "dequantized = scale * q + bias (fp32), row-major flat order of the unpacked [..., out, in] weight"
    with open(os.path.join(d, "quant_check.json"), "w") as f:
        f.write('{"note": ' + json.dumps(note) + ',\n "tensors": [\n  ' +
                ",\n  ".join(json.dumps(e) for e in entries) + "\n]}\n")


def write_config_defaults(out):
    names = ["Qwen3Config", "Qwen3MoeConfig", "Qwen3NextConfig", "Qwen3_5TextConfig", "Qwen3_5VisionConfig",
             "Qwen3_5Config", "Qwen3_5MoeTextConfig", "Qwen3_5MoeConfig"]
    doc = OrderedDict([("transformers", transformers.__version__),
                       ("note", "to_dict() of each default-constructed config class")])
    for n in names:
        try:
            doc[n] = json.loads(json.dumps(getattr(transformers, n)().to_dict(), default=str, sort_keys=True))
        except Exception as e:
            doc[n] = {"error": f"{type(e).__name__}: {e}"}
            log(f"  {n}() failed: {e}")
    write_json(os.path.join(out, "hf_config_defaults.json"), doc)


def main():
    global torch, transformers
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output folder (gets one subfolder per fixture)")
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    args = ap.parse_args()

    import torch as _torch
    import transformers as _transformers
    torch, transformers = _torch, _transformers
    torch.manual_seed(SEED)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    log(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"numpy {np.__version__}")
    try:
        import safetensors
        log(f"safetensors {safetensors.__version__}")
    except Exception as e:
        log(f"safetensors import failed: {e}")
    for n in ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
              "Qwen3_5MoeForConditionalGeneration", "Qwen3_5TextConfig", "Qwen3_5MoeTextConfig",
              "Qwen3_5VisionConfig", "Qwen3_5Config", "Qwen3_5MoeConfig", "Qwen3NextConfig"]:
        if not hasattr(transformers, n):
            log(f"MISSING class transformers.{n}")
    try:
        from transformers.utils import import_utils as iu
        log(f"flash-linear-attention available: {iu.is_flash_linear_attention_available()}, "
            f"causal-conv1d available: {iu.is_causal_conv1d_available()}")
    except Exception as e:
        log(f"(could not query fla availability: {e})")

    check_bitstream()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="golden_work_")
    prompts = make_prompts()
    only = set(filter(None, args.only.split(",")))
    want = lambda n: not only or n in only
    tv = transformers.__version__
    state, failed = {}, []
    t0 = time.time()
    plan = [(n, lambda n=n: make_hf_fixture(n, args.out, work, prompts, tv, state))
            for n in ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", *HF_VARIANTS)]
    plan += [(n, lambda n=n: make_mlx_fixture(n, args.out, work, prompts, state)) for n in MLX_FIXTURES]
    for n, fn in plan:
        if not want(n):
            continue
        t = time.time()
        try:
            fn()
            log(f"  {n}: done in {time.time() - t:.1f}s")
        except Exception as e:
            failed.append(n)
            log(f"  {n}: FAILED: {type(e).__name__}: {e}")
            traceback.print_exc()
            shutil.rmtree(os.path.join(args.out, n), ignore_errors=True)
    if want("hf_config_defaults"):
        write_config_defaults(args.out)
    with open(os.path.join(args.out, "make_golden.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")
    total = 0
    for root, _, fs in os.walk(args.out):
        for f in fs:
            total += os.path.getsize(os.path.join(root, f))
    log(f"total output {total} bytes ({total / 2 ** 20:.2f} MiB) in {time.time() - t0:.1f}s; failed: {failed}")
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
