#!/usr/bin/env bash
# A/B of two builds of the CPU library on the encoder and prefill shapes of bench/cpu_vs_peers.py, with the op
# alone (bench/cpu_op_timing.cpp): each shape runs A, B, A, B for SECONDS each, and the table keeps each build's
# faster median (the machine's run-to-run spread is a few percent). A/B > 1: B is faster.
#   usage: bench/cpu_ab_timing.sh LIBDIR_A LIBDIR_B DTYPE(f32|f16|bf16) [SECONDS] [TIMING_BINARY] [encoder|decode]
#   (decode: the few-query rows of bench/cpu_vs_peers.py instead: Whisper's decoder step and cross-attention,
#   Llama-3-8B decode over 4k keys at batch 1 and 8; positions-first K/V here.)
set -euo pipefail
a=$1 b=$2 dtype=$3 seconds=${4:-1} bin=${5:-build/cpu_op_timing} set_name=${6:-encoder}
shapes=("1 12 12 128 128 32 0 minilm_b1_s128" "8 12 12 128 128 32 0 minilm_b8_s128" "1 12 12 128 128 64 0 bert_b1_s128"
        "1 12 12 512 512 64 0 bert_b1_s512" "8 12 12 128 128 64 0 bert_b8_s128" "8 12 12 512 512 64 0 bert_b8_s512"
        "1 12 12 1500 1500 64 0 whisper_enc_1500" "1 32 8 512 512 128 1 llama8b_prefill_512"
        "1 32 8 128 4096 128 1 llama8b_chunk128_k4k")
if [ "$set_name" = decode ]; then
  shapes=("1 12 12 1 448 64 1 whisper_dec_448" "1 12 12 1 1500 64 0 whisper_cross_1q"
          "1 32 8 1 4096 128 1 llama8b_decode_b1_k4k" "8 32 8 1 4096 128 1 llama8b_decode_b8_k4k")
fi
time_one() { LD_LIBRARY_PATH=$1 "$bin" "${@:2}" 2>/dev/null | awk '{print $2}'; }
printf '| case | A µs | B µs | A / B |\n|---|---|---|---|\n'
for s in "${shapes[@]}"; do
  set -- $s
  args=("$1" "$2" "$3" "$4" "$5" "$6" "$dtype" "$7" "$seconds")
  ta1=$(time_one "$a" "${args[@]}"); tb1=$(time_one "$b" "${args[@]}")
  ta2=$(time_one "$a" "${args[@]}"); tb2=$(time_one "$b" "${args[@]}")
  python3 -c "a=min($ta1,$ta2); b=min($tb1,$tb2); print('| $8 | %.1f | %.1f | %.3f |' % (a, b, a / b))"
done
