#!/usr/bin/env python3
"""Our attention kernel and a peer's on one case, side by side in Nsight Compute's counters: duration, the
instructions issued (in all and per pipe: MUFU = xu, FMA, ALU), issue activity, warps per scheduler, the stall
reasons and the bytes from L2 and DRAM. Where a case trails a peer, this says whether the peer does less work
(fewer instructions, fewer exponentials on the MUFU) or the same work with fewer stalls.

Each kernel is one launch after a few warm ones, caches left warm and clocks as they are (as ncu_source.py).
Ours runs under the timing tool (bench/cuda_timing.cpp), the peer under PyTorch's SDPA (bench/bench_cuda.py's
calls). Raw pages go to OUT/ncu_<case>_<who>.csv.

    usage: bench/ncu_vs_peer.py TIMING_BINARY CASE [--peer cudnn|flash] [--dtype float16] [--env VAR=value]
"""
import argparse
import csv
import io
import os
import subprocess
import sys

SECTIONS = ["SpeedOfLight", "ComputeWorkloadAnalysis", "InstructionStats", "WarpStateStats", "LaunchStats",
            "Occupancy", "MemoryWorkloadAnalysis"]
METRICS = ["smsp__inst_executed.sum", "smsp__inst_executed_pipe_xu.sum", "smsp__inst_executed_pipe_fma.sum",
           "smsp__inst_executed_pipe_alu.sum", "smsp__inst_executed_pipe_fp16.sum",
           "smsp__inst_executed_pipe_uniform.sum", "smsp__inst_executed_pipe_lsu.sum",
           "lts__throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "lts__t_sector_hit_rate.pct"]
# (label, metric): the rows of the table, in order; a metric ncu did not report prints as "-".
ROWS = [("duration (us)", "gpu__time_duration.sum"),
        ("instructions", "smsp__inst_executed.sum"),
        ("  MUFU (xu pipe)", "smsp__inst_executed_pipe_xu.sum"),
        ("  FMA pipe", "smsp__inst_executed_pipe_fma.sum"),
        ("  ALU pipe", "smsp__inst_executed_pipe_alu.sum"),
        ("  FP16 pipe", "smsp__inst_executed_pipe_fp16.sum"),
        ("  uniform pipe", "smsp__inst_executed_pipe_uniform.sum"),
        ("  LSU pipe", "smsp__inst_executed_pipe_lsu.sum"),
        ("issue active (% of cycles)", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
        ("warps active per scheduler", "smsp__warps_active.avg.per_cycle_active"),
        ("registers per thread", "launch__registers_per_thread"),
        ("block size", "launch__block_size"),
        ("grid size", "launch__grid_size"),
        ("shared memory per block (B)", "launch__shared_mem_per_block_dynamic"),
        ("L2 -> L1/TMA read bytes", "lts__t_sectors_srcunit_tex_op_read.sum"),
        ("DRAM read bytes", "dram__bytes_read.sum"),
        ("L2 throughput (% of peak)", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        ("L2 hit rate (%)", "lts__t_sector_hit_rate.pct"),
        ("DRAM throughput (% of peak)", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        ("cycles active (SM avg)", "sm__cycles_active.avg")]


def stall_name(metric):
    """The reason in a WarpStateStats metric (smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio
    or the like), or None for another metric."""
    if "issue_stalled_" not in metric or not metric.endswith(".ratio"):
        return None
    reason = metric.split("issue_stalled_", 1)[1][: -len(".ratio")]
    return reason.replace("_per_issue_active", "")


def collect(cmd, kernel_regex, skip, name, out, env):
    rep = os.path.join("/tmp", name)
    base = ["ncu", "--clock-control", "none", "--cache-control", "none", "--kernel-name", f"regex:{kernel_regex}",
            "--launch-skip", str(skip), "--launch-count", "1", "--force-overwrite", "-o", rep]
    for s in SECTIONS:
        base += ["--section", s]
    for metrics in (METRICS, []):  # (again without the extra metrics if this ncu does not know one)
        extra = ["--metrics", ",".join(metrics)] if metrics else []
        r = subprocess.run(base + extra + cmd, capture_output=True, text=True, env=env)
        if os.path.exists(rep + ".ncu-rep"):
            break
    else:
        print(f"{name}: no report\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
        return {}
    raw = subprocess.run(["ncu", "--import", rep + ".ncu-rep", "--page", "raw", "--csv"], capture_output=True,
                         text=True).stdout
    os.remove(rep + ".ncu-rep")
    with open(os.path.join(out, f"{name}.csv"), "w") as f:
        f.write(raw)
    rows = list(csv.reader(io.StringIO(raw)))
    if len(rows) < 3:
        return {}
    names, units, values = rows[0], rows[1], rows[2]
    found = {}
    for n, u, v in zip(names, units, values):
        try:
            x = float(v.replace(",", ""))
        except ValueError:
            continue
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
                 "sector": 32.0}.get(u, 1.0)
        found[n] = x * scale
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("timing")
    ap.add_argument("case")
    ap.add_argument("--peer", default="cudnn", choices=["cudnn", "flash"])
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--env", action="append", default=[], help="VAR=value for our run (a plan switch)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    env = dict(os.environ)
    for setting in args.env:
        k, v = setting.split("=", 1)
        env[k] = v
    ours = collect([args.timing, args.case, args.dtype], "attention", 10, f"ncu_{args.case}_ours", args.out, env)
    here = os.path.dirname(os.path.abspath(__file__))
    script = ("import sys, torch; sys.path.insert(0, %r)\n"
              "from bench_cuda import SEED, LLM, peer\n"
              "c = {x[0]: x for x in SEED + LLM}[%r]; _, b, hq, hkv, sq, sk, d, causal = c\n"
              "dt = getattr(torch, %r)\n"
              "q = torch.randn(b, hq, sq, d, device='cuda', dtype=dt)\n"
              "k = torch.randn(b, hkv, sk, d, device='cuda', dtype=dt)\n"
              "v = torch.randn(b, hkv, sk, d, device='cuda', dtype=dt)\n"
              "f = peer(%r, q, k, v, causal)\n"
              "for _ in range(12): f()\n"
              "torch.cuda.synchronize()\n") % (here, args.case, args.dtype, args.peer)
    regex = "cudnn|sdpa" if args.peer == "cudnn" else "flash_fwd"
    theirs = collect([sys.executable, "-c", script], regex, 5, f"ncu_{args.case}_{args.peer}", args.out,
                     dict(os.environ))
    print(f"## {args.case} ({args.dtype}): attnkit vs {args.peer}\n")
    print(f"| counter | attnkit | {args.peer} |\n|---|---|---|")
    for label, metric in ROWS:
        a, b = ours.get(metric), theirs.get(metric)
        print(f"| {label} | {'-' if a is None else f'{a:,.6g}'} | {'-' if b is None else f'{b:,.6g}'} |")
    stalls = sorted({m for m in list(ours) + list(theirs) if stall_name(m)},
                    key=lambda m: -max(ours.get(m, 0.0), theirs.get(m, 0.0)))
    print(f"\n| stall (warps per issue) | attnkit | {args.peer} |\n|---|---|---|")
    for m in stalls[:14]:
        print(f"| {stall_name(m)} | {ours.get(m, 0.0):.2f} | {theirs.get(m, 0.0):.2f} |")
    return 0 if ours and theirs else 1


if __name__ == "__main__":
    sys.exit(main())
