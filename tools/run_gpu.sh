#!/usr/bin/env bash
# The GPU runs behind results/h200/: one H200 with the SGLang server and the trainer on it (--colocate), the
# README's one-GPU quick start as written, with $M the model folder (SmolLM2-135M-Instruct; a user's $M is the hub's
# name, HuggingFaceTB/SmolLM2-135M-Instruct). Phases (default: all, in this order):
#   quickstart  the README's two commands: serve.sh, then 100 steps; its metrics.jsonl, log and wall time
#   trl         TRL's GRPOTrainer on the same work (tools/trl_grpo.py), beside the quickstart's numbers
#   trust       the sync check: a correct run at lr 1e-6, and pushes dropped on purpose after step 10
#               (tools/negative_control.py): weights dropped with the tag kept; half the tensors dropped
#   cost        the weight check's cost per push at the 135M, 1.5B and 7B shapes (tools/check_cost.py)
#
#   M=/path/to/model RES=/tmp/res bash tools/run_gpu.sh [phase ...]      # results in $RES, one log line per phase
# (STEPS, TRL_STEPS: shorter runs to try it; the trl phase installs the wheels in .whl/ if there are any)
# The server here needs ATTENTION_BACKEND=triton EXTRA_ARGS="--sampling-backend pytorch" (this machine's SGLang has
# no FA3 or flashinfer kernels); a stock SGLang install needs neither.
set -uo pipefail
M=${M:?set M to the model folder}
RES=${RES:-/tmp/res}
mkdir -p "$RES"
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*" | tee -a "$RES/pipeline.log"; }
QUICK=(--colocate --model "$M" --dataset builtin --prompts_per_step 16 --max_new_tokens 128 --lr 1e-5
       --steps "${STEPS:-100}" --eval_every 20)
# run NAME OUT_DIR TIMEOUT CMD...: one training run (writing to OUT_DIR), its log and metrics.jsonl in $RES
run() { local name=$1 dir=$2 limit=$3; shift 3; log "$name: $*"; local t0=$SECONDS
  timeout "$limit" "$@" > "$RES/$name.log" 2>&1
  local code=$?
  local last; last=$(grep -E '^error|^step +[0-9]+ ' "$RES/$name.log" | tail -n 1 | cut -c1-150)
  log "$name: exit $code after $((SECONDS - t0)) s: $last"
  cp "$dir/metrics.jsonl" "$RES/$name.metrics.jsonl" 2>/dev/null; return 0; }
server() {  # the README's server line, once
  curl -sf "http://127.0.0.1:30000/health" > /dev/null && return
  local t0=$SECONDS
  GPU=0 MEM_FRACTION=0.3 MODEL=$M LOG=$RES/serve.log bash serve.sh || { log "server did not start"; exit 1; }
  log "server healthy after $((SECONDS - t0)) s"; }

phases=${*:-quickstart trl trust cost}
{ python3 -c "import sglang, torch, transformers, sys
print('python', sys.version.split()[0], '| sglang', sglang.__version__, '| torch', torch.__version__,
      '| transformers', transformers.__version__)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
} > "$RES/versions.txt" 2>&1
for phase in $phases; do
  case $phase in
  quickstart)
    server
    rm -rf runs/grpo  # the README's command as written, into its default --out_dir
    run quickstart runs/grpo 900 torchrun --nproc_per_node 1 grpo_sglang.py "${QUICK[@]}" ;;
  trl)
    server  # (idle while TRL trains: it holds its 30% of the memory, as in the quickstart)
    [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target "${SITE:-/tmp/site}" .whl/*.whl
    log "trl: tools/trl_grpo.py"; t0=$SECONDS
    timeout 900 python3 tools/trl_grpo.py --model "$M" --steps "${TRL_STEPS:-40}" --out /tmp/runs/trl \
        > "$RES/trl.log" 2>&1
    log "trl: exit $? after $((SECONDS - t0)) s"
    cp /tmp/runs/trl/steps.jsonl "$RES/trl.steps.jsonl"; cp /tmp/runs/trl/summary.json "$RES/trl.summary.json" ;;
  trust)
    server
    run lr1e-6 /tmp/runs/lr1e-6 900 torchrun --nproc_per_node 1 grpo_sglang.py "${QUICK[@]}" --lr 1e-6 \
        --out_dir /tmp/runs/lr1e-6
    for neg in "dropped_tag_kept --skip 11-100 --tag_skipped" "dropped_half --half 11-100"; do
      set -- $neg
      run "$1" "/tmp/runs/$1" 600 torchrun --nproc_per_node 1 tools/negative_control.py "${@:2}" -- "${QUICK[@]}" \
          --eval_every 0 --out_dir "/tmp/runs/$1"
    done ;;
  cost)
    log "cost: tools/check_cost.py"
    timeout 900 python3 tools/check_cost.py --out "$RES/check_cost.json" > "$RES/check_cost.log" 2>&1
    log "cost: exit $?: $(tail -n 1 "$RES/check_cost.log" | cut -c1-200)" ;;
  *) log "unknown phase $phase" ;;
  esac
done
log "done: $phases"
