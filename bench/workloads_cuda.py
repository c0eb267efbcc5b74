"""attnkit's CUDA backend on the attention calls of real models, outside the tuned benchmark table: model families'
head dims, GQA ratios (7:1, 71:1, MQA), sliding windows and softcaps, batch sizes from 1 to 128, prefill, chunked
prefill, speculative-decoding verify steps and decode steps. Side by side in one process with the strongest peer
PyTorch offers for each call:

  - SDPA's cuDNN, FlashAttention-2 and memory-efficient backends where the call has no window and no softcap
    (bottom-right causal through `causal_lower_right` where the queries are fewer than the keys);
  - FlexAttention (`torch.compile`d Triton kernels, block-sparse masks) for every call, and as the only peer of a
    window or a softcap.

Every call is checked first against a float64 reference on sampled query rows (scaled error), then timed with
CUDA-graph replay (median). The ratio is the best peer's time over attnkit's (> 1: attnkit faster).

`--random N` adds N calls drawn at random (seeded) from the space around the named ones: head dims 32-256 (model
families' and the odd ones between), GQA ratios 1-16 and MQA, batch 1-64, decode, verify, chunked-prefill,
causal-prefill and encoder calls; no window or softcap among them, and no FlexAttention (its compile per call would
take the run's time): a grouped call with a bottom-right causal rule, which SDPA's fused kernels do not take, runs
them on K/V repeated per query head beforehand (more K/V bytes for the peer: a weaker baseline on decode-like calls). The summary sorts them by ratio, the lowest first:
where a plan or kernel falls off a cliff outside the named calls.

Run (on a GPU machine, attnkit importable):  python3 bench/workloads_cuda.py --out DIR [--quick] [--only a,b]
                                              [--random N [--seed S] [--no-named]]
"""
import argparse
import datetime
import math
import os
import sys

import torch
import torch.nn.functional as F
import triton.testing as tt
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cuda import driver_version, git_commit  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False


# (name, batch, query heads, K/V heads, q_len, k_len, head dim, V head dim, causal, window, softcap)
def W(name, b, hq, hkv, sq, sk, d, dv=None, causal=True, window=None, softcap=None):
    return dict(name=name, b=b, hq=hq, hkv=hkv, sq=sq, sk=sk, d=d, dv=dv or d, causal=causal, window=window,
                softcap=softcap)


WORKLOADS = [
    # Prefill (one prompt, or a few), causal.
    W("llama3_8b_prefill_b1_s8k", 1, 32, 8, 8192, 8192, 128),
    W("llama3_8b_prefill_b8_s1k", 8, 32, 8, 1024, 1024, 128),
    W("qwen2_7b_prefill_b2_s4k", 2, 28, 4, 4096, 4096, 128),
    W("mistral_7b_prefill_s8k_window4k", 1, 32, 8, 8192, 8192, 128, window=4096),
    W("gemma2_9b_prefill_s4k_softcap", 1, 16, 8, 4096, 4096, 256, softcap=50.0),
    W("gemma2_9b_prefill_s8k_window4k_softcap", 1, 16, 8, 8192, 8192, 256, window=4096, softcap=50.0),
    W("phi3_mini_prefill_b2_s4k", 2, 32, 32, 4096, 4096, 96),
    W("phi2_prefill_b4_s2k", 4, 32, 32, 2048, 2048, 80),
    W("falcon_7b_prefill_b2_s2k_mqa71", 2, 71, 1, 2048, 2048, 64),
    W("deepseek_v2_mla_prefill_s4k", 1, 128, 128, 4096, 4096, 192, dv=128),
    W("llama3_8b_chunk_512_of_8k", 4, 32, 8, 512, 8192, 128),
    W("llama3_8b_chunk_512_of_8k_b1", 1, 32, 8, 512, 8192, 128),
    # Encoders and diffusion (no mask).
    W("sd15_unet_self_4096_d40", 2, 8, 8, 4096, 4096, 40, causal=False),
    W("sd15_unet_self_1024_d80", 2, 8, 8, 1024, 1024, 80, causal=False),
    W("sd15_unet_cross_4096x77_d40", 2, 8, 8, 4096, 77, 40, causal=False),
    W("sdxl_self_4096_d64", 2, 10, 10, 4096, 4096, 64, causal=False),
    W("vit_h14_b32_s257_d80", 32, 16, 16, 257, 257, 80, causal=False),
    W("bert_base_b64_s128", 64, 12, 12, 128, 128, 64, causal=False),
    # Speculative-decoding verify steps and decode steps.
    W("llama3_8b_verify_b16_q5_k4k", 16, 32, 8, 5, 4096, 128),
    W("llama3_70b_verify_b8_q16_k4k", 8, 64, 8, 16, 4096, 128),
    W("llama3_8b_decode_b1_k8k", 1, 32, 8, 1, 8192, 128),
    W("llama3_8b_decode_b128_k1k", 128, 32, 8, 1, 1024, 128),
    W("llama3_70b_decode_b8_k8k", 8, 64, 8, 1, 8192, 128),
    W("qwen2_7b_decode_b32_k4k", 32, 28, 4, 1, 4096, 128),
    W("mistral_7b_decode_b16_k16k_window4k", 16, 32, 8, 1, 16384, 128, window=4096),
    W("gemma2_9b_decode_b16_k4k_softcap", 16, 16, 8, 1, 4096, 256, softcap=50.0),
    W("phi3_mini_decode_b16_k4k", 16, 32, 32, 1, 4096, 96),
    W("falcon_7b_decode_b32_k2k_mqa71", 32, 71, 1, 1, 2048, 64),
    W("qwen2_0p5b_decode_b64_k2k_d64", 64, 14, 2, 1, 2048, 64),
]


def random_workloads(n, seed):
    """n calls drawn from the space of real models' calls (bench/random_calls.py), each small enough to time fast."""
    from random_calls import draw

    return [W(c["name"], c["b"], c["hq"], c["hkv"], c["sq"], c["sk"], c["d"], causal=c["causal"])
            for c in draw(n, seed, max_flops=4e11, max_kv_bytes=2e9)]


def visible_range(w, i):
    """The keys query row i sees: [lo, hi] (bottom-right causal, window of W keys ending at the causal limit)."""
    off = w["sk"] - w["sq"]
    hi = min(w["sk"] - 1, i + off) if w["causal"] else w["sk"] - 1
    lo = max(0, hi - w["window"] + 1) if w["window"] else 0
    return lo, hi


def visible_pairs(w):
    return sum(max(0, hi - lo + 1) for lo, hi in (visible_range(w, i) for i in range(w["sq"])))


def kv_bytes_read(w, elem):
    """The K/V bytes the call must read at least: each K/V head's keys that any of its rows sees."""
    lo = min(visible_range(w, i)[0] for i in range(w["sq"]))
    hi = max(visible_range(w, i)[1] for i in range(w["sq"]))
    return w["b"] * w["hkv"] * max(0, hi - lo + 1) * (w["d"] + w["dv"]) * elem


def reference(w, q, k, v, rows):
    """float64 on the GPU, the rows `rows` of every (batch, head)."""
    g = w["hq"] // w["hkv"]
    qd = q[:, :, rows].double()
    kd = k.double().repeat_interleave(g, dim=1)
    vd = v.double().repeat_interleave(g, dim=1)
    s = qd @ kd.transpose(-1, -2) / math.sqrt(w["d"])
    if w["softcap"]:
        s = w["softcap"] * torch.tanh(s / w["softcap"])
    keys = torch.arange(w["sk"], device=q.device)
    lo_hi = torch.tensor([visible_range(w, int(i)) for i in rows.tolist()], device=q.device)
    visible = (keys[None, :] >= lo_hi[:, :1]) & (keys[None, :] <= lo_hi[:, 1:])
    s = s.masked_fill(~visible, float("-inf"))
    return torch.softmax(s, dim=-1) @ vd


def sampled_rows(sq, device):
    if sq <= 256:
        return torch.arange(sq, device=device)
    return torch.cat([torch.arange(128, device=device), torch.arange(sq - 128, sq, device=device)])


def sdpa_peers(w, q, k, v, expand=False):
    """SDPA's backends, where SDPA states the call on its fused kernels: no window, no softcap, and a bottom-right
    causal rule over more keys than queries (`causal_lower_right`) only with as many K/V heads as query heads (with
    grouped heads that path expands K/V or leaves the fused kernels: no baseline; FlexAttention takes it)."""
    if w["window"] or w["softcap"]:
        return []
    gqa = w["hq"] != w["hkv"]
    kw = {}
    if w["causal"] and w["sq"] > 1:
        if w["sq"] == w["sk"]:
            kw["is_causal"] = True
        elif gqa and not expand:
            return []
        else:
            if gqa:  # (expand: K/V repeated per query head before timing, an MHA call; for the random calls)
                k = k.repeat_interleave(w["hq"] // w["hkv"], dim=1)
                v = v.repeat_interleave(w["hq"] // w["hkv"], dim=1)
                gqa = False
            from torch.nn.attention.bias import causal_lower_right
            kw["attn_mask"] = causal_lower_right(w["sq"], w["sk"])
    peers = []
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                          ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        def run(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa, **kw)
        peers.append((name, run))
    return peers


def flex_peer(w, q, k, v):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    off = w["sk"] - w["sq"]
    causal, window, cap = w["causal"], w["window"], w["softcap"]

    def mask_mod(b, h, qi, kj):
        visible = kj >= 0
        if causal:
            visible = visible & (kj <= qi + off)
        if window:
            limit = qi + off if causal else w["sk"] - 1
            visible = visible & (kj > limit - window)
        return visible

    block_mask = None
    if causal or window:
        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=w["sq"], KV_LEN=w["sk"], device="cuda")
    score_mod = None
    if cap:
        def score_mod(score, b, h, qi, kj):
            return cap * torch.tanh(score / cap)
    # A fresh compile per call: dynamo's recompile limit (8) would otherwise drop later calls to the unfused path.
    torch._dynamo.reset()
    compiled = torch.compile(flex_attention, dynamic=False)
    gqa = w["hq"] != w["hkv"]
    return [("flex", lambda: compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa))]


def scaled_error(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def time_us(fn, rep):
    try:
        return 1000.0 * tt.do_bench_cudagraph(fn, rep=rep, return_mode="median")
    except Exception:  # a peer that cannot be captured: timed eagerly, said in the note
        return float("nan")


def measure(w, dtype, rep, attnkit, with_flex=True):
    torch.manual_seed(0)
    q = torch.randn(w["b"], w["hq"], w["sq"], w["d"], device="cuda", dtype=dtype)
    k = torch.randn(w["b"], w["hkv"], w["sk"], w["d"], device="cuda", dtype=dtype)
    v = torch.randn(w["b"], w["hkv"], w["sk"], w["dv"], device="cuda", dtype=dtype)
    o = torch.empty(w["b"], w["hq"], w["sq"], w["dv"], device="cuda", dtype=dtype)
    rows = sampled_rows(w["sq"], q.device)
    ref = reference(w, q, k, v, rows)
    kwargs = dict(causal=w["causal"], window=w["window"], softcap=w["softcap"], out=o)
    variants = [("attnkit", lambda: attnkit.attention(q, k, v, **kwargs))]
    variants += sdpa_peers(w, q, k, v, expand=not with_flex)
    try:
        variants += flex_peer(w, q, k, v) if with_flex else []
    except Exception as e:  # noqa: BLE001 (this torch has no FlexAttention for the call)
        print(f"  flex refused: {type(e).__name__}: {str(e)[:120]}", flush=True)
    r = {"case": w["name"], "dtype": str(dtype).split(".")[-1]}
    for name, fn in variants:
        try:
            out = fn()
            torch.cuda.synchronize()
            r[name + "_err"] = scaled_error(out[:, :, rows], ref)
            if not r[name + "_err"] < 2e-2:
                r[name + "_note"] = "wrong"
                continue
            r[name + "_us"] = time_us(fn, rep)
        except Exception as e:  # noqa: BLE001 (a peer that refuses the call: head dim, GQA ratio, mask)
            r[name + "_note"] = f"{type(e).__name__}"
    peers = {p: r[p + "_us"] for p in ("cudnn", "flash", "efficient", "flex")
             if not math.isnan(r.get(p + "_us", float("nan")))}
    r["best_peer"] = min(peers, key=peers.get) if peers else "–"
    r["best_peer_us"] = peers[r["best_peer"]] if peers else float("nan")
    elem = q.element_size()
    r["flops"] = 4.0 * w["b"] * w["hq"] * visible_pairs(w) * (w["d"] + w["dv"]) / 2
    r["bytes"] = kv_bytes_read(w, elem) + elem * (q.numel() + o.numel())
    del q, k, v, o, ref
    torch.cuda.empty_cache()
    return r


def fmt(x, spec):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def line(r):
    t = r.get("attnkit_us", float("nan"))
    decode_like = r["flops"] / max(r["bytes"], 1) < 64
    rate = (f"{fmt(r['bytes'] / t / 1e6, '5.2f')} TB/s" if decode_like else f"{fmt(r['flops'] / t / 1e6, '5.0f')} TF/s")
    peers = " ".join(f"{p} {fmt(r.get(p + '_us'), '.1f')}{'(' + r[p + '_note'] + ')' if p + '_note' in r else ''}"
                     for p in ("cudnn", "flash", "efficient", "flex"))
    return (f"| {r['case']} | {r['dtype']} | {fmt(t, '.1f')} | {rate} | {fmt(r.get('attnkit_err'), '.1e')} | {peers} | "
            f"{r['best_peer']} | {fmt(r['best_peer_us'] / t, '.2f')} |")


def main():
    import attnkit

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", help="comma-separated workload names")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--random", type=int, default=0, help="also N random calls (SDPA peers only)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-named", action="store_true", help="only the random calls")
    args = ap.parse_args()
    rep = 25 if args.quick else 100
    only = set(args.only.split(",")) if args.only else None
    header = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC | {torch.cuda.get_device_name()} | "
              f"driver {driver_version()} | torch {torch.__version__} | cuDNN {torch.backends.cudnn.version()} | "
              f"commit {git_commit()} | CUDA-graph replay, median (rep {rep} ms) | command: {' '.join(sys.argv)}")
    lines = [header, "", "| call | dtype | attnkit µs | attnkit rate | error | peers µs | best peer | best peer / attnkit |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    named = [] if args.no_named else [w for w in WORKLOADS if not only or w["name"] in only]
    drawn = random_workloads(args.random, args.seed) if args.random else []
    results = []
    for w in named + drawn:
        for d in args.dtypes.split(","):
            r = measure(w, getattr(torch, d), rep, attnkit, with_flex=w not in drawn)
            results.append((w in drawn, r))
            lines.append(line(r))
            print(lines[-1], flush=True)
    if drawn:  # the random calls again, the lowest ratio first
        ranked = sorted((r for is_drawn, r in results if is_drawn),
                        key=lambda r: r["best_peer_us"] / r.get("attnkit_us", float("nan"))
                        if not math.isnan(r["best_peer_us"]) else math.inf)
        lines += ["", f"Random calls (seed {args.seed}), the lowest ratio first:", "", lines[2], lines[3]]
        lines += [line(r) for r in ranked]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "workloads_cuda.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
