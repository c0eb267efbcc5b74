#!/usr/bin/env bash
# Every kernel of one attnkit call and of cuDNN's SDPA on the same decode-or-prefill shape, in Nsight Compute's
# counters: duration, DRAM bytes and throughput, SM cycles active, grid and block (a call's main kernel, its merge
# pass, cuDNN's kernels). Shows where a short call's time goes, kernel by kernel, beside the peer's.
#   usage: bench/ncu_call_kernels.sh B H HKV SQ SK D CAUSAL(0|1) [dtype [plan]]   (on the GPU machine, from a bundle)
set -uo pipefail
[ -d build/gpu-bundle/lib ] && export LD_LIBRARY_PATH="$PWD/build/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
b=$1 h=$2 hkv=$3 sq=$4 sk=$5 d=$6 causal=$7 dtype=${8:-bfloat16} plan=${9:-}
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_active.avg,launch__grid_size,launch__block_size
# (kernel name | metric | value) rows of ncu's CSV
rows() { grep -E '^"' | awk -F'","' 'NR > 1 { gsub(/"/, "", $NF); printf "%-60.60s | %-55s | %s\n", $5, $(NF-2), $NF }'; }
echo "== attnkit ($dtype, plan '${plan}')"
timeout 60 ncu --clock-control none --cache-control none --launch-skip 40 --launch-count 4 --metrics "$metrics" --csv \
  "${TIMING:-build/gpu-bundle/attnkit_cuda_timing}" "shape:$b,$h,$hkv,$sq,$sk,$d,$causal" "$dtype" "$plan" | rows
echo "== cuDNN (PyTorch SDPA)"
timeout 90 ncu --clock-control none --cache-control none \
  --launch-skip 20 --launch-count 6 --metrics "$metrics" --csv python3 -c "
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
dt = getattr(torch, '$dtype')
q = torch.randn($b, $h, $sq, $d, device='cuda', dtype=dt)
k = torch.randn($b, $hkv, $sk, $d, device='cuda', dtype=dt); v = torch.randn_like(k)
with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    for _ in range(40): F.scaled_dot_product_attention(q, k, v, is_causal=bool($causal) and $sq > 1, enable_gqa=$h != $hkv)
torch.cuda.synchronize()
" | rows
