"""Random attention calls drawn from the space of real models' calls: head dims of real models (32-256), K/V head
counts and grouping ratios (including multi-query 71:1), batch sizes 1-64, and five kinds of call (a decode step,
a speculative verify step, a prompt chunk against a cache, a causal prefill, an encoder without a mask), so that a
benchmark finds the cliffs a user meets by choosing another model or batch rather than only the named table.
Shared by bench/workloads_cuda.py (the GPU) and bench/cpu_vs_peers.py (the CPU), which size the draws differently.
"""
import random

DIMS = [32, 40, 48, 64, 72, 80, 96, 104, 112, 128, 160, 192, 256]


def draw(n, seed, max_flops, max_kv_bytes, min_flops=1e6):
    """n calls as dicts (name, b, hq, hkv, sq, sk, d, causal; causal is bottom-right), each at most max_flops
    (4 b hq sq sk d) and max_kv_bytes of K/V at 2 bytes an element. The draw order is fixed: a seed gives the same
    calls wherever the bounds are the same."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        d = rng.choice(DIMS)
        hkv = rng.choice([1, 2, 4, 8, 8, 16, 32])
        ratio = rng.choice([1, 1, 2, 4, 4, 7, 8, 16]) if hkv > 1 else rng.choice([8, 16, 32, 71])
        hq = hkv * ratio
        if hq > 128:
            continue
        kind = rng.choice(["decode", "verify", "chunk", "prefill", "encoder"])
        b = rng.choice([1, 2, 4, 8, 16, 32, 64])
        if kind == "decode":
            sq, sk = 1, rng.choice([512, 1000, 2048, 4096, 8192, 16384])
        elif kind == "verify":
            sq, sk = rng.choice([2, 4, 5, 8, 16]), rng.choice([1024, 2048, 4096, 8192])
        elif kind == "chunk":
            sq = rng.choice([64, 128, 256, 512])
            sk = sq + rng.choice([1024, 2048, 4096, 8192])
        elif kind == "prefill":
            sq = sk = rng.choice([200, 512, 1024, 1500, 2048, 4096])
        else:
            sq = sk = rng.choice([77, 128, 197, 257, 512, 1024, 4096])
        flops = 4.0 * b * hq * sq * sk * d
        kv_bytes = 2.0 * b * hkv * sk * d * 2
        if flops > max_flops or kv_bytes > max_kv_bytes or flops < min_flops:
            continue
        name = f"r{len(out):02d}_{kind}_b{b}_h{hq}x{hkv}_q{sq}_k{sk}_d{d}"
        out.append(dict(name=name, b=b, hq=hq, hkv=hkv, sq=sq, sk=sk, d=d, causal=kind != "encoder"))
    return out
