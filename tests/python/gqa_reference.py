"""An independent float64 NumPy GroupQueryAttention, written from the contract (/work/shared/SPEC-gqa.md), not
from the C++ code. The oracle for what ONNX Runtime's CPU provider rejects (Q/K norm, bfloat16, partial rotary
below its multiple-of-8 rule, batched prompt chunks, mixed float / quantized caches, ...).

It is split the way the op is, so that each part can be checked on its own:

    prep = prepare(inputs, attrs)                  # lengths, Q' and the new K / V rows (norm, rotary)
    want = expected_cache(prep, inputs, attrs, ...) # the present caches, row by row (codes for int8 / int4)
    out, qk = attention(prep, k_rows, v_rows, ...) # the attention over given cache contents (float64)

A test checks the op's present caches against `expected_cache`, then the op's output against `attention` run on
the op's own (checked) caches, dequantized: a quantized code that rounds the other way at an exact .5 then
cannot turn into a spurious output mismatch.
"""

import numpy as np


def np_float(dtype):
    return np.dtype(dtype)


def round_to(x, dtype):
    """float64 values rounded to the query's float type (float32 / float16 / bfloat16), back in float64."""
    return np.asarray(x, dtype=np.float64).astype(dtype).astype(np.float64)


class Prepared:
    """The resolved call: shapes, per-batch lengths, Q' [B, N, S, H] and new K / V [B, Nkv, S, H] (float64)."""


def split_tokens(inputs, N, Nkv):
    q = inputs["query"]
    B, S, W = q.shape
    if inputs.get("key") is None:
        H = W // (N + 2 * Nkv)
        k = q[..., N * H:(N + Nkv) * H]
        v = q[..., (N + Nkv) * H:]
        q = q[..., :N * H]
    else:
        H = W // N
        k, v = inputs["key"], inputs["value"]

    def heads(x, n):
        return np.asarray(x, np.float64).reshape(B, S, n, H).transpose(0, 2, 1, 3)

    return heads(q, N), heads(k, Nkv), heads(v, Nkv), H


def rms_norm(x, w, eps):
    """x [.., H] * rsqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(w, np.float64)


def rotate(x, positions, cos_cache, sin_cache, interleaved):
    """x [B, heads, S, H]; positions [B, S]. Rotates the first 2 * cos_cache.shape[1] dimensions."""
    half = cos_cache.shape[1]
    cos = np.asarray(cos_cache, np.float64)[positions][:, None]  # [B, 1, S, half]
    sin = np.asarray(sin_cache, np.float64)[positions][:, None]
    y = x.copy()
    if interleaved:
        x1, x2 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        y[..., 0:2 * half:2] = x1 * cos - x2 * sin
        y[..., 1:2 * half:2] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., :half], x[..., half:2 * half]
        y[..., :half] = x1 * cos - x2 * sin
        y[..., half:2 * half] = x2 * cos + x1 * sin
    return y


def prepare(inputs, attrs):
    N, Nkv = attrs["num_heads"], attrs["kv_num_heads"]
    dtype = inputs["query"].dtype
    q, k, v, H = split_tokens(inputs, N, Nkv)
    B, _, S, _ = q.shape
    p = Prepared()
    p.B, p.S, p.N, p.Nkv, p.H, p.dtype = B, S, N, Nkv, H, dtype
    p.seqlens = np.asarray(inputs["seqlens_k"]).astype(np.int64)
    p.total = int(np.asarray(inputs["total_sequence_length"]).reshape(()))
    p.T = p.seqlens + 1
    p.first_prompt = S == p.total
    p.past = np.zeros(B, np.int64) if p.first_prompt else p.T - S
    if inputs.get("position_ids") is not None:
        p.positions = np.asarray(inputs["position_ids"], np.int64)[:, :S]
    else:
        p.positions = p.past[:, None] + np.arange(S)[None, :]
    prepared = False
    if inputs.get("q_norm_weight") is not None:
        eps = attrs.get("qk_norm_epsilon", 1e-6)
        q = rms_norm(q, inputs["q_norm_weight"], eps)
        k = rms_norm(k, inputs["k_norm_weight"], eps)
        prepared = True
    if attrs.get("do_rotary", 0):
        il = bool(attrs.get("rotary_interleaved", 0))
        q = rotate(q, p.positions, inputs["cos_cache"], inputs["sin_cache"], il)
        k = rotate(k, p.positions, inputs["cos_cache"], inputs["sin_cache"], il)
        prepared = True
    if prepared:  # Q' and the new K rows are tensors of the query's type
        q, k = round_to(q, dtype), round_to(k, dtype)
    p.q, p.k, p.v = q, k, v
    scale = attrs.get("scale", 0.0)
    p.scale = float(np.float32(scale)) if scale else float(np.float32(1.0) / np.sqrt(np.float32(H)))
    return p


# ---- quantized rows ----------------------------------------------------------------------------------------------

def scales_for(scale, mode, Nkv, H):
    """[Nkv, 1, H] float32 scales of a PER_TENSOR / PER_CHANNEL cache."""
    s = np.asarray(scale, np.float32).reshape(-1)
    if mode == "PER_TENSOR":
        return np.full((Nkv, 1, H), s[0], np.float32)
    return s.reshape(Nkv, 1, H)


def quantize(x, scales, bits):
    """float64 values [.., Nkv, rows, H] -> int codes: clamp(rint(x * (1 / scale))), float32 arithmetic."""
    inv = np.float32(1.0) / scales
    q = np.rint(np.asarray(x, np.float32) * inv)
    lo, hi = (-128, 127) if bits == 8 else (-8, 7)
    return np.clip(q, lo, hi).astype(np.int64)


def pack_int4(codes):
    """codes [..., H] in [-8, 7] -> bytes [..., (H + 1) // 2] (low nibble: even index; +8 bias)."""
    c = codes.astype(np.int64) + 8
    if c.shape[-1] % 2:
        c = np.concatenate([c, np.full(c.shape[:-1] + (1,), 8)], axis=-1)  # odd H: a zero value in the last high nibble
    return ((c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)).astype(np.uint8)


def unpack_int4(packed, H):
    b = np.asarray(packed).astype(np.uint8).astype(np.int64)
    codes = np.empty(b.shape[:-1] + (2 * b.shape[-1],), np.int64)
    codes[..., 0::2] = (b & 0xF) - 8
    codes[..., 1::2] = (b >> 4) - 8
    return codes[..., :H]


def codes_of(cache, bits, H):
    """Integer codes [B, Nkv, rows, H] of an int8 / int4 cache tensor."""
    return unpack_int4(cache, H) if bits == 4 else np.asarray(cache).astype(np.int64)


def dequantize(cache, scale, mode, bits, H):
    """A quantized cache tensor -> float64 values (one float32 product code * scale, as every reader does)."""
    Nkv = np.asarray(cache).shape[1]
    s = scales_for(scale, mode, Nkv, H)
    return (codes_of(cache, bits, H).astype(np.float32) * s).astype(np.float64)


def cache_values(cache, attrs, which, scale, H):
    """A present / past cache tensor as float64 values, dequantized when it is quantized."""
    mode = attrs.get(which + "_quant_type", "NONE")
    if mode == "NONE":
        return np.asarray(cache, np.float64)
    return dequantize(cache, scale, mode, attrs.get("kv_cache_bit_width", 8), H)


# ---- the cache ---------------------------------------------------------------------------------------------------

def window_layout(p, past_rows_capacity, capacity, sliding):
    """Per batch entry: (rows of the past kept, first token held by present row 0, resident rows).

    Without a window cache, row r holds token r. A window cache (sliding_window_cache = 1) holds the newest tokens:
    the past rows hold tokens [past - min(past, P), past); appending S rows to a full cache drops the oldest
    rows from the front."""
    out = []
    for b in range(p.B):
        past, T = int(p.past[b]), int(p.T[b])
        if not sliding:
            out.append((past, 0, T if not p.first_prompt else max(T, p.S)))
            continue
        kept = min(past, past_rows_capacity)
        resident = min(kept + p.S, capacity)
        out.append((kept, T - resident, resident))
    return out


def expected_cache(p, inputs, attrs, which, present_shape, shared, past_before=None):
    """The expected present cache `which` ('key' / 'value') and a boolean mask of the rows the contract defines.

    Values are in the cache's storage: float64 values of the query's type, or integer codes [B, Nkv, C, H] for
    a quantized cache. present_shape is the present tensor's shape; past_before the past tensor as it was before
    the call (needed for shared buffers and copies)."""
    H = p.H
    mode = attrs.get(which[0] + "_quant_type", "NONE")
    bits = attrs.get("kv_cache_bit_width", 8)
    quantized = mode != "NONE"
    new = p.k if which == "key" else p.v
    C = present_shape[2]
    sliding = bool(attrs.get("sliding_window_cache", 0))
    past = past_before
    P = 0 if past is None else past.shape[2]
    if quantized:
        scales = scales_for(inputs[which[0] + "_scale"], mode, p.Nkv, H)
        new_rows = quantize(round_to(new, p.dtype), scales[None], bits)
        past_rows = None if past is None else codes_of(past, bits, H)
        zero = 0
    else:
        new_rows = round_to(new, p.dtype)
        past_rows = None if past is None else np.asarray(past, np.float64)
        zero = 0.0
    want = np.zeros((p.B, p.Nkv, C, H), np.float64 if not quantized else np.int64)
    if shared:
        want[:] = past_rows
    defined = np.zeros((p.B, C), bool)
    for b, (kept, first, resident) in enumerate(window_layout(p, P, C, sliding)):
        past_b = int(p.past[b])
        if sliding:
            drop = kept + p.S - resident
            rows = []
            if kept:
                rows.append(past_rows[b, :, :kept])
            rows.append(new_rows[b])
            allrows = np.concatenate(rows, axis=1)[:, drop:]
            if not shared:
                want[b] = zero
            want[b, :, :resident] = allrows
            defined[b, :] = True  # separate: zeros after the resident rows; shared: a full cache, or untouched rows
            continue
        if not shared and past_b:
            want[b, :, :past_b] = past_rows[b, :, :past_b]
        want[b, :, past_b:past_b + p.S] = new_rows[b]
        if not shared:
            want[b, :, past_b + p.S:] = zero
            defined[b, :] = True
        else:
            defined[b, :] = True  # every row: untouched ones keep the past's content
    return want, defined


# ---- attention ---------------------------------------------------------------------------------------------------

def attention(p, inputs, attrs, k_rows, v_rows, first_token):
    """Output [B, S, N*H] and output_qk [B, N, S, total] (None unless qk_output) in float64, over the cache
    contents k_rows / v_rows [B, Nkv, C, H] (float64 values) whose row r holds token first_token[b] + r."""
    B, S, N, Nkv, H = p.B, p.S, p.N, p.Nkv, p.H
    group = N // Nkv
    causal = attrs.get("causal", 1) == 1
    W = attrs.get("local_window_size", -1)
    softcap = attrs.get("softcap", 0.0)
    bias = inputs.get("attention_bias")
    sink = inputs.get("head_sink")
    smooth = attrs.get("smooth_softmax", -1) == 1
    qk_output = attrs.get("qk_output", 0)
    out = np.zeros((B, N, S, H))
    qk = np.zeros((B, N, S, p.total)) if qk_output else None
    for b in range(B):
        first = int(first_token[b])
        rows = int(p.T[b]) - first
        tokens = first + np.arange(rows)
        pos = int(p.past[b]) + np.arange(S)
        visible = np.ones((S, rows), bool)
        if causal:
            visible &= tokens[None, :] <= pos[:, None]
        if W > 0:
            visible &= tokens[None, :] > pos[:, None] - W
        K = np.repeat(k_rows[b, :, :rows], group, axis=0)  # [N, rows, H]
        V = np.repeat(v_rows[b, :, :rows], group, axis=0)
        s = p.scale * (p.q[b] @ K.transpose(0, 2, 1))
        if softcap:
            s = softcap * np.tanh(s / softcap)
        if bias is not None:
            bb = np.asarray(bias, np.float64)
            bb = bb[b if bb.shape[0] > 1 else 0]  # [N or 1, S, total]
            s = s + bb[:, :, tokens]
        s = np.where(visible[None], s, -np.inf)
        m = s.max(axis=-1, keepdims=True) if rows else np.full((N, S, 1), -np.inf)
        if sink is not None or smooth:
            logit = np.zeros(N) if sink is None else np.asarray(sink, np.float64)
            logit = logit[:, None, None]
            m = np.maximum(m, logit)
        m = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(s - m)
        denom = e.sum(axis=-1, keepdims=True)
        if sink is not None or smooth:
            denom = denom + np.exp(logit - m)
        with np.errstate(invalid="ignore", divide="ignore"):
            prob = np.where(denom > 0, e / np.where(denom > 0, denom, 1.0), 0.0)
        out[b] = prob @ V
        if qk_output == 1:
            qk[b][:, :, tokens] = np.where(visible[None], s, 0.0)
        elif qk_output == 2:
            qk[b][:, :, tokens] = prob
    return out.transpose(0, 2, 1, 3).reshape(B, S, N * H), qk


def scaled_error(got, want, rows=None):
    """max |got - want| / max |want| (float64), optionally over a boolean row selection."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    if rows is not None:
        got, want = got[rows], want[rows]
    if want.size == 0:
        return 0.0
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
