#!/usr/bin/env bash
# The GPU path's profile in one go (<= 5 minutes on one GPU): run it as it is on a GPU machine.
#
# Usage: tools/gpu_profile.sh [OUT_DIR]      (default: $OUT if set, else ./gpu-profile)
#
# 1. tools/gpu_check.sh --sizes "10M"      the CUDA paths work at all (its JSON: gpu_check.json)
# 2. tools/profile_step.py --device cuda    torch.profiler over one step of Qwen2.5-0.5B's shapes, bf16,
#                                           at 2, 8 and 24 layers: top kernels, GPU busy fraction, kernel
#                                           launches and host syncs per step (profile_step.jsonl)
#    and the same with packed micro-batches (--packing true: profile_step_packed.jsonl)
# 3. tools/bench_step.py --device cuda      ours vs transformers + fused AdamW, padded and packed rows: tokens/s,
#                                           ratio, mfu, peak memory, peak_loss_bytes (chunked logits vs whole) at
#                                           4K tokens (bench_step.jsonl; H100/H200 dense bf16 peak: 989 TFLOP/s)
# 4. tools/bench_rollout.py --backends vllm where vllm imports: generation throughput (bench_rollout.jsonl)
# Each step has its own time limit; a failed step is reported and the next one runs. Prints a summary.
set -u
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-gpu-profile}}"
mkdir -p "$OUT_DIR"
PY=.venv/bin/python
[ -x "$PY" ] || PY="${PYTHON:-python3}"
PEAK="${PEAK_TFLOPS:-989}"
status=0

step() {  # step NAME SECONDS OUTFILE CMD...
    local name=$1 limit=$2 out=$3
    shift 3
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT_DIR/$out" 2> "$OUT_DIR/$name.err"
    local rc=$?
    echo "$name: rc $rc in $((SECONDS - t0)) s -> $OUT_DIR/$out" >&2
    [ $rc -eq 0 ] || { status=1; tail -5 "$OUT_DIR/$name.err" >&2; }
}

step gpu_check 90 gpu_check.json bash tools/gpu_check.sh --sizes "10M"
step profile_step 90 profile_step.jsonl "$PY" tools/profile_step.py --device cuda --model qwen2.5-0.5b \
    --precision bf16 --layers 2,8,24 --samples 8 --micro-batch 2
step profile_step_packed 60 profile_step_packed.jsonl "$PY" tools/profile_step.py --device cuda --model qwen2.5-0.5b \
    --precision bf16 --layers 24 --samples 8 --packing true --max-tokens 2048
step bench_step 120 bench_step.jsonl "$PY" tools/bench_step.py --device cuda --models quickstart,qwen2.5-0.5b \
    --precision bf16,fp32 --attention sdpa,local --packing false,true --reps 3 --peak-tflops "$PEAK" --json
if "$PY" -c "import vllm" 2>/dev/null; then
    step bench_rollout 60 bench_rollout.jsonl "$PY" tools/bench_rollout.py --backends hf,vllm
else
    echo "bench_rollout: vllm does not import here; skipped" >&2
fi
echo "--- summary" >&2
cat "$OUT_DIR"/profile_step.jsonl "$OUT_DIR"/profile_step_packed.jsonl "$OUT_DIR"/bench_step.jsonl 2>/dev/null
exit $status
