#!/usr/bin/env bash
# The exact commands behind results/h200/check_v2, results/x2/ and the GPU rows of the README, on one
# nvidia-h200-x2 machine (2 H200s) with the GPU kit (../shared/gpu: SGLang 0.5.16, SmolLM2-135M-Instruct):
#   . .gpukit/a/env.sh && setsid bash results/run_x2.sh > /tmp/res/pipeline.out 2>&1 &                 (phases A-D)
#   . .gpukit/a/env.sh && PHASES=tf32 setsid bash results/run_x2.sh > /tmp/res/pipeline.out 2>&1 &     (one of the
#      PHASES below: nccl_big_models, memory_steps_7b, tf32, tf32_7b, check_async, layout, multi (= multi_tests multi_bench),
#      train_speed_final,
#      or several at once;
#      results/README.md says which commit ran which)
# It copies the repo to /tmp/work and runs from there; everything lands in $RES (default /tmp/res).
# Phases run in priority order; a failing command is logged and the next one runs.
#   A  GPU 0, server and trainer colocated: the 300-step run with the version + mismatch check, the
#      negative controls, colocated sync vs async (30 steps each)
#   B  GPU 1 meanwhile: NCCL between processes that see one GPU each, random-weight models, peak memory
#      of a 7B-shaped training step with/without checkpointing, tiny Qwen3 and Gemma 3 through the trainer
#   C  trainer GPU 0, server GPU 1: SmolLM2 100 steps sync vs async, a 50-step --sync nccl run with the
#      server's GPU hidden (as on another host) and the --sync tensor refusal, the GPU tests, the sync bench
#   D  the same layout with random 1.5B- and 7B-shaped Qwen2.5 models: step times sync vs async, sync bench
set -uo pipefail
RES=${RES:-/tmp/res}
M=/tmp/models
mkdir -p "$RES" "$M"
if [ "$(pwd)" != /tmp/work ]; then rm -rf /tmp/work && cp -r . /tmp/work && cd /tmp/work; fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 ATTENTION_BACKEND=triton
export EXTRA_ARGS="--sampling-backend pytorch --cuda-graph-max-bs-decode 192"
K=${KIT_MODEL_DIR:?run . .gpukit/a/env.sh first}
log() { echo "[$(date +%T)] $*" | tee -a "$RES/pipeline.log"; }
serve() { # name gpu port model mem_fraction
  GPU=$2 PORT=$3 MODEL=$4 MEM_FRACTION=$5 LOG="$RES/serve_$1.log" PIDFILE="/tmp/serve_$1.pid" timeout 900 bash serve.sh \
    >> "$RES/pipeline.log" 2>&1 || log "server $1 FAILED"; }
stop() { PIDFILE="/tmp/serve_$1.pid" bash serve.sh stop >> "$RES/pipeline.log" 2>&1; }
train() { # log-name out-dir timeout, then flags (CUDA_VISIBLE_DEVICES from the caller's environment)
  local name=$1 out=$2 t=$3; shift 3
  log "train $name: $*"
  rm -rf "$out"  # a run never writes into another run's folder
  timeout "$t" python3 -m torch.distributed.run --nproc_per_node 1 --master_port $((20000 + RANDOM % 9000)) \
    ${SCRIPT:-grpo_sglang.py} --out_dir "$out" "$@" > "$RES/$name.log" 2>&1
  log "train $name: exit $? ($(tail -n 1 "$RES/$name.log" | cut -c1-160))"
  [ -f "$out/metrics.jsonl" ] && cp "$out/metrics.jsonl" "$RES/$name.metrics.jsonl"
  [ -f "$out/config.json" ] && cp "$out/config.json" "$RES/$name.config.json"; }
NEG="results/tools/negative_control.py --skip"  # the negative controls: pushes skipped on purpose (SCRIPT="$NEG 6")
SMOL=(--model "$K" --dataset builtin --builtin_max_operand 20 --prompts_per_step 16 --group_size 8 --max_new_tokens 128
      --micro_batch 128 --lr 1e-5 --beta 0.04 --save_every 0)
BIG=(--dataset builtin --prompts_per_step 24 --group_size 8 --max_new_tokens 128 --lr 1e-6 --eval_every 0
     --save_every 0 --eval_size 8 --server_gpu 1)
memory_7b() { # gpu: one 7B-shaped training step without and with checkpointing, side by side
  for ck in "" --grad_checkpointing; do
    CUDA_VISIBLE_DEVICES=$1 timeout 400 python3 results/tools/memory_step.py --model "$M/qwen2.5-7b-random" $ck --micro_batch 4 \
      --sequences 16 --out "$RES/memory_7b${ck:+_ckpt}.json" > "$RES/memory_7b${ck:+_ckpt}.log" 2>&1
    log "memory 7b ${ck:-no-ckpt}: exit $? $(tail -c 300 "$RES/memory_7b${ck:+_ckpt}.json" 2>/dev/null | tr '\n' ' ')"
  done; }
sync_vs_async() { # name model port timeout, then flags: x2_<name>_sync and x2_<name>_async, back to back
  local name=$1 model=$2 port=$3 t=$4; shift 4
  train x2_${name}_sync /tmp/r/${name}s "$t" --model "$model" --server_url http://127.0.0.1:$port "${BIG[@]}" "$@" --no-async
  train x2_${name}_async /tmp/r/${name}a "$t" --model "$model" --server_url http://127.0.0.1:$port "${BIG[@]}" "$@" --async; }
make_model() { # name(s) timeout log-file: random-weight models from tools/make_models.py, built on GPU 0
  CUDA_VISIBLE_DEVICES=0 timeout "$2" python3 results/tools/make_models.py "$M" --tokenizer "$K" --only "$1" > "$RES/$3" 2>&1
  log "make_models: exit $?"; }
serve_dedicated() { # mem_fraction: SmolLM2 on GPU 1, port 30010, under the pid file the GPU tests reuse
  GPU=1 PORT=30010 MODEL="$K" MEM_FRACTION=$1 LOG="$RES/serve_dedicated.log" PIDFILE=/tmp/grpo_gpu_test.pid \
    timeout 900 bash serve.sh >> "$RES/pipeline.log" 2>&1; }
gpu_tests() { # timeout: pytest -k gpu_real against that server
  log "gpu tests"
  GRPO_TEST_MODEL="$K" GRPO_TEST_PORT=30010 GRPO_TEST_PIDFILE=/tmp/grpo_gpu_test.pid timeout "$1" \
    python3 -m pytest -q -s test_smoke.py -k "gpu_real or on_cuda" > "$RES/gpu_tests.log" 2>&1
  log "gpu tests: exit $? $(tail -n 1 "$RES/gpu_tests.log")"; }
bench_x2() { # name model port timeout reps
  log "bench $1"; timeout "$4" python3 bench.py --layout x2 --model "$2" --server_url http://127.0.0.1:$3 \
    --parts sync --reps "$5" --out "$RES/bench_$1" > "$RES/bench_$1.log" 2>&1; log "bench $1: exit $?"; }

{ python3 -c "import sglang, torch, transformers, sys; print('python', sys.version.split()[0], '| sglang', sglang.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; nvidia-smi topo -m; } > "$RES/versions.txt" 2>&1
log "start"

phase_a() {
  serve coloc 0 30000 "$K" 0.3
  local U=(--server_url http://127.0.0.1:30000 --colocate --no-async)
  CUDA_VISIBLE_DEVICES=0 train check_v2_main /tmp/r/main 900 "${SMOL[@]}" "${U[@]}" --steps 300 --eval_every 100
  CUDA_VISIBLE_DEVICES=0 SCRIPT="$NEG 6" train check_v2_skip_one /tmp/r/skip1 300 "${SMOL[@]}" "${U[@]}" --steps 12 \
    --eval_every 0
  CUDA_VISIBLE_DEVICES=0 SCRIPT="$NEG 4-40" train check_v2_stop_syncing /tmp/r/stop3 300 "${SMOL[@]}" "${U[@]}" \
    --steps 40 --eval_every 0
  CUDA_VISIBLE_DEVICES=0 SCRIPT="$NEG 4-40 --tag_skipped" train check_v2_dropped_tagged /tmp/r/drop3 300 "${SMOL[@]}" \
    "${U[@]}" --steps 40 --eval_every 0
  CUDA_VISIBLE_DEVICES=0 train coloc_sync /tmp/r/coloc_sync 300 "${SMOL[@]}" "${U[@]}" --steps 30 --eval_every 0
  CUDA_VISIBLE_DEVICES=0 train coloc_async /tmp/r/coloc_async 300 "${SMOL[@]}" "${U[@]}" --steps 30 --eval_every 0 --async
  stop coloc
  log "phase A done"
}

phase_b() {
  for seen in 0 0,1; do timeout 200 python3 results/tools/nccl_check.py $seen >> "$RES/nccl_check.log" 2>&1; done
  : > /tmp/nccl_env
  if ! grep -q "trainer sees 0): ok" "$RES/nccl_check.log"; then
    NCCL_P2P_DISABLE=1 timeout 200 python3 results/tools/nccl_check.py 0 >> "$RES/nccl_check.log" 2>&1 && echo NCCL_P2P_DISABLE=1 > /tmp/nccl_env
  fi
  log "$(grep 'nccl_check' "$RES/nccl_check.log" | tr '\n' ' ') -> NCCL env for the NCCL runs: '$(cat /tmp/nccl_env)'"
  CUDA_VISIBLE_DEVICES=1 timeout 400 python3 results/tools/make_models.py "$M" --tokenizer "$K" > "$RES/make_models.log" 2>&1
  log "make_models: exit $?"
  memory_7b 1
  for arch in qwen3 gemma3; do
    serve $arch 1 30001 "$M/$arch-tiny-random" 0.2
    CUDA_VISIBLE_DEVICES=1 train arch_$arch /tmp/r/$arch 400 --model "$M/$arch-tiny-random" --server_url http://127.0.0.1:30001 \
      --colocate --dataset builtin --prompts_per_step 16 --group_size 8 --max_new_tokens 64 --steps 15 --lr 1e-5 \
      --eval_every 0 --save_every 0
    stop $arch
  done
  # the dedicated layout's server for phase C (the GPU tests reuse it through its pid file)
  env $(cat /tmp/nccl_env) GPU=1 PORT=30010 MODEL="$K" MEM_FRACTION=0.3 LOG="$RES/serve_dedicated.log" PIDFILE=/tmp/grpo_gpu_test.pid \
    timeout 900 bash serve.sh >> "$RES/pipeline.log" 2>&1
  log "phase B done"
}

phase_c() {
  local U=(--server_url http://127.0.0.1:30010 --server_gpu 1)
  train x2_smol_sync /tmp/r/x2_sync 900 "${SMOL[@]}" "${U[@]}" --steps 100 --eval_every 50 --no-async
  train x2_smol_async /tmp/r/x2_async 900 "${SMOL[@]}" "${U[@]}" --steps 100 --eval_every 50 --async
  CUDA_VISIBLE_DEVICES=0 train x2_nccl_refuse_tensor /tmp/r/refuse 120 "${SMOL[@]}" "${U[@]}" --steps 2 --sync tensor
  [ -s /tmp/nccl_env ] && export "$(cat /tmp/nccl_env)"  # what phase B found NCCL needs between one-GPU processes
  CUDA_VISIBLE_DEVICES=0 train x2_nccl_hidden_gpu /tmp/r/x2_nccl 900 "${SMOL[@]}" "${U[@]}" --steps 50 --eval_every 50 --async
  serve q15 1 30011 "$M/qwen2.5-1.5b-random" 0.3 & Q15=$!  # phase D's server starts during the tests and the bench
  gpu_tests 600
  bench_x2 smol "$K" 30010 600 3
  log "phase C done"
}

phase_d() {
  PIDFILE=/tmp/grpo_gpu_test.pid bash serve.sh stop >> "$RES/pipeline.log" 2>&1
  wait "$Q15"
  sync_vs_async q15 "$M/qwen2.5-1.5b-random" 30011 600 --steps 12 --micro_batch 32
  serve q7 1 30012 "$M/qwen2.5-7b-random" 0.4 & Q7=$!  # starts while the 1.5B bench runs
  bench_x2 q15 "$M/qwen2.5-1.5b-random" 30011 600 3
  stop q15
  wait "$Q7"
  sync_vs_async q7 "$M/qwen2.5-7b-random" 30012 900 --steps 6 --micro_batch 8 --grad_checkpointing
  bench_x2 q7 "$M/qwen2.5-7b-random" 30012 600 2
  stop q7
  log "phase D done"
}

# PHASES=nccl_big_models: what phases A-D could not finish or had to re-run after fixes — the 7B memory
# step with checkpointing (the FSDP recompute cast), the --sync nccl run with the server's GPU hidden and the
# GPU tests (the unbound default process group), the 1.5B/7B step times sync vs async and their sync bench.
nccl_big_models() {
  # GPU 1: the dedicated layout's SmolLM2 server starts (cold, ~2 min) while GPU 0 builds the models and
  # measures the 7B step's peak memory without and with checkpointing, side by side
  serve_dedicated 0.15 & SMOLSRV=$!
  make_model qwen2.5-1.5b-random,qwen2.5-7b-random 400 make_models.log
  memory_7b 0
  wait $SMOLSRV
  local U=(--server_url http://127.0.0.1:30010 --server_gpu 1)
  serve q15 1 30011 "$M/qwen2.5-1.5b-random" 0.3 & Q15=$!  # the next server loads while the SmolLM2 runs go on
  CUDA_VISIBLE_DEVICES=0 train x2_nccl_hidden_gpu /tmp/r/x2_nccl 600 "${SMOL[@]}" "${U[@]}" --steps 50 --eval_every 50 \
    --async --request_timeout 120
  if grep -Eq "^step +50 " "$RES/x2_nccl_hidden_gpu.log"; then
    gpu_tests 500
  fi
  PIDFILE=/tmp/grpo_gpu_test.pid bash serve.sh stop >> "$RES/pipeline.log" 2>&1
  wait $Q15
  sync_vs_async q15 "$M/qwen2.5-1.5b-random" 30011 400 --steps 12 --micro_batch 32
  serve q7 1 30012 "$M/qwen2.5-7b-random" 0.4 & Q7=$!  # starts while the 1.5B bench runs
  bench_x2 q15 "$M/qwen2.5-1.5b-random" 30011 400 3
  stop q15
  wait $Q7
  sync_vs_async q7 "$M/qwen2.5-7b-random" 30012 500 --steps 6 --micro_batch 8 --grad_checkpointing
  bench_x2 q7 "$M/qwen2.5-7b-random" 30012 500 2
  stop q7
  log "nccl_big_models done"
}

# PHASES=memory_steps_7b: the 7B memory step and 7B step times again after the fused-AdamW fix (in
# nccl_big_models the 7B runs ran out of memory in foreach Adam's temporaries at the first optimizer step)
memory_steps_7b() {
  make_model qwen2.5-7b-random 400 make_models.log
  serve q7 1 30012 "$M/qwen2.5-7b-random" 0.4 & Q7=$!  # loads while GPU 0 measures the memory
  memory_7b 0
  wait $Q7
  sync_vs_async q7 "$M/qwen2.5-7b-random" 30012 500 --steps 6 --micro_batch 8 --grad_checkpointing
  stop q7
  log "memory_steps_7b done"
}

# PHASES=tf32: the LM head on TF32 tensor cores (--head_matmul tf32, the default before f7ee041) against
# exact fp32 (--head_matmul fp32; before 2026-12-01 --no-tf32_head), side by side: 1.5B step times sync vs async (issue 10's 0.65 target) and the 1.5B sync
# step without it; SmolLM2 100 steps sync vs async, and async without it (does the batch mismatch move?); the GPU tests.
tf32() {
  make_model qwen2.5-1.5b-random 300 make_models.log
  serve q15 1 30011 "$M/qwen2.5-1.5b-random" 0.3 & Q15=$!
  serve_dedicated 0.15 & SMOLSRV=$!  # loads while the 1.5B runs
  wait $Q15
  sync_vs_async q15 "$M/qwen2.5-1.5b-random" 30011 400 --steps 12 --micro_batch 32 --head_matmul tf32
  train x2_q15_sync_fp32_head /tmp/r/q15s_fp32 400 --model "$M/qwen2.5-1.5b-random" --server_url http://127.0.0.1:30011 \
    "${BIG[@]}" --steps 12 --micro_batch 32 --no-async --head_matmul fp32
  stop q15
  wait $SMOLSRV
  local U=(--server_url http://127.0.0.1:30010 --server_gpu 1)
  train x2_smol_sync /tmp/r/x2_sync 400 "${SMOL[@]}" "${U[@]}" --steps 100 --eval_every 50 --no-async --head_matmul tf32
  train x2_smol_async /tmp/r/x2_async 400 "${SMOL[@]}" "${U[@]}" --steps 100 --eval_every 50 --async --head_matmul tf32
  train x2_smol_async_fp32_head /tmp/r/x2_async_fp32 400 "${SMOL[@]}" "${U[@]}" --steps 100 --eval_every 50 --async --head_matmul fp32
  gpu_tests 500
  PIDFILE=/tmp/grpo_gpu_test.pid bash serve.sh stop >> "$RES/pipeline.log" 2>&1
  log "tf32 done"
}

# PHASES=tf32_7b: the 7B step times sync vs async with the TF32 head (if the device time allows)
tf32_7b() {
  make_model qwen2.5-7b-random 300 make_models_7b.log
  serve q7 1 30012 "$M/qwen2.5-7b-random" 0.4
  sync_vs_async q7 "$M/qwen2.5-7b-random" 30012 500 --steps 6 --micro_batch 8 --grad_checkpointing --head_matmul tf32
  stop q7
  log "tf32_7b done"
}

# PHASES=check_async: the exact sync check in async mode (results/x2/check_async/). Trainer GPU 0, servers GPU 1.
# SmolLM2 at --lr 5e-5, where one step of policy change crosses the old rule's 0.1 (the batch mismatch, server θ_{s-1}
# vs trainer θ_s), 120 async steps under the new rule (re-scored rows, the same weights on both sides); if that run
# never crosses 0.1, the same at --lr 1e-4. The three negative controls in async mode at the same lr. The 1.5B-shaped
# model, async, with and without re-scoring (--check_seqs 0), side by side.
check_async() {
  make_model qwen2.5-1.5b-random 300 make_models.log & MK=$!  # GPU 0 builds it while GPU 1 starts SmolLM2's server
  serve_dedicated 0.15
  wait $MK
  serve q15 1 30011 "$M/qwen2.5-1.5b-random" 0.3 & Q15=$!     # loads while the SmolLM2 runs go on
  local U=(--server_url http://127.0.0.1:30010 --server_gpu 1 --async --lr 5e-5)
  train async_lr5e-5 /tmp/r/ca 400 "${SMOL[@]}" "${U[@]}" --steps 120 --eval_every 40
  if ! python3 -c "import json, sys; sys.exit(not any(r.get('mismatch_mean', 0) > 0.1 for r in map(json.loads, open('$RES/async_lr5e-5.metrics.jsonl'))))"; then
    train async_lr1e-4 /tmp/r/ca4 400 "${SMOL[@]}" "${U[@]}" --lr 1e-4 --steps 120 --eval_every 40
  fi
  SCRIPT="$NEG 6" train neg_async_skip_one /tmp/r/n1 200 "${SMOL[@]}" "${U[@]}" --steps 12 --eval_every 0
  SCRIPT="$NEG 4-40" train neg_async_stop_syncing /tmp/r/n2 200 "${SMOL[@]}" "${U[@]}" --steps 40 --eval_every 0
  SCRIPT="$NEG 4-120 --tag_skipped" train neg_async_dropped_tagged /tmp/r/n3 300 "${SMOL[@]}" "${U[@]}" --steps 120 \
    --eval_every 0
  wait $Q15
  for c in 32 0; do
    train x2_q15_async_check$c /tmp/r/q15c$c 300 --model "$M/qwen2.5-1.5b-random" --server_url http://127.0.0.1:30011 \
      "${BIG[@]}" --steps 12 --micro_batch 32 --async --check_seqs $c
  done
  stop q15
  log "check_async done"
}

# PHASES=layout: the guard of the student-first layout (results/x2/layout/): SmolLM2 async, 100 steps, the flags of the
# recorded run (x2/async/x2_smol_async at c5458af), and the GPU tests, against the dedicated server on GPU 1.
layout() {
  serve_dedicated 0.15  # already up after check_async; cold otherwise (~2 min)
  train x2_smol_async /tmp/r/lay 400 "${SMOL[@]}" --server_url http://127.0.0.1:30010 --server_gpu 1 --steps 100 \
    --eval_every 50 --async
  gpu_tests 500
  PIDFILE=/tmp/grpo_gpu_test.pid bash serve.sh stop >> "$RES/pipeline.log" 2>&1
  log "layout done"
}

# PHASES=multi: rollouts from several servers (results/x2/multi/), = multi_tests then multi_bench.
# multi_tests: the GPU tests: a TP-2 server over GPUs 0-1 with the trainer colocated on GPU 0, and two servers on GPU 1
# (tensor, and NCCL with their GPU hidden), exact weights on every rank of every server (a random Qwen3-shaped tiny
# model: SmolLM2's 9 heads do not split over 2 ranks). Servers start one after another: SGLang sizes its KV cache from
# the memory that is free while it loads, so a server starting beside another one that is still allocating (on any of
# its GPUs) can find none left (f939f2a: the TP-2 server and the two servers on GPU 1 started at once).
multi_tests() {
  make_model qwen3-tiny-random,qwen2.5-1.5b-random 400 make_models_multi.log
  local Q3="$M/qwen3-tiny-random" S=(timeout 900 bash serve.sh)
  GPU=0,1 TP=2 PORT=30020 MODEL=$Q3 MEM_FRACTION=0.1 LOG=$RES/serve_q3_tp2.log PIDFILE=/tmp/serve_q3tp.pid "${S[@]}" >> "$RES/pipeline.log" 2>&1
  GPU=1 SERVERS=2 PORT=30030 MODEL=$Q3 MEM_FRACTION=0.15 LOG=$RES/serve_q3_two.log PIDFILE=/tmp/serve_q3two.pid "${S[@]}" >> "$RES/pipeline.log" 2>&1
  log "multi gpu tests"
  GRPO_TEST_MULTI_MODEL=$Q3 GRPO_TEST_TP_URL=http://127.0.0.1:30020 GRPO_TEST_TWO_URLS=http://127.0.0.1:30030,http://127.0.0.1:30031 \
    timeout 600 python3 -m pytest -q -s test_smoke.py -k several_servers_hold_exactly > "$RES/gpu_tests_multi.log" 2>&1
  log "multi gpu tests: exit $? $(tail -n 1 "$RES/gpu_tests_multi.log")"
  for f in q3tp q3two; do PIDFILE=/tmp/serve_$f.pid bash serve.sh stop >> "$RES/pipeline.log" 2>&1; done
  log "multi_tests done"
}

# multi_bench: the 1.5B-shaped model, 24 x 8 prompts, 1024 new tokens: one server (GPU 1) against two (one colocated with
# the trainer on GPU 0, one on GPU 1), sync (--no-async: the trainer leaves GPU 0 to the server while it generates) and
# async, side by side; then rollouts alone, one server against the same requests split over the two (rollout_split.py).
multi_bench() {
  local Q15="$M/qwen2.5-1.5b-random"
  [ -d "$Q15" ] || make_model qwen2.5-1.5b-random 400 make_models_bench.log
  serve q15 1 30011 "$Q15" 0.3 & C=$!
  serve q15b 0 30012 "$Q15" 0.3 & D=$!  # on two different GPUs with nothing else on them: side by side is safe
  wait $C $D
  bench_multi() { # name urls server_gpus colocate-flag async-flag
    log "bench $1"; timeout 500 python3 bench.py --parts step --model "$Q15" --server_url "$2" --max_new_tokens 1024 \
      --group_size 8 --step_warmup 2 --out "$RES/bench_$1" --step_args --prompts_per_step 24 --steps 6 --server_gpu "$3" \
      "$4" "$5" --micro_batch 8 --lr 1e-6 --eval_size 8 > "$RES/bench_$1.log" 2>&1; log "bench $1: exit $?"; }
  bench_multi one_server_sync http://127.0.0.1:30011 1 --no-colocate --no-async
  bench_multi two_servers_sync http://127.0.0.1:30012,http://127.0.0.1:30011 0,1 --colocate --no-async
  log "rollout split"
  timeout 400 python3 results/tools/rollout_split.py --urls http://127.0.0.1:30011,http://127.0.0.1:30012 --batches 192,768 \
    --out "$RES/rollout_split.json" > "$RES/rollout_split.log" 2>&1; log "rollout split: exit $?"
  bench_multi one_server_async http://127.0.0.1:30011 1 --no-colocate --async
  bench_multi two_servers_async http://127.0.0.1:30012,http://127.0.0.1:30011 0,1 --colocate --async
  stop q15; stop q15b
  log "multi_bench done"
}
multi() { multi_tests; multi_bench; }

# PHASES="nan speed learn variants profile coloc q15": the same at the final commit of the train-speed issue's packed
# micro-batches (results/x2/train_speed/at-<commit>/, results/x2/variants/at-<commit>/), nan first.
# PHASES="learn variants speed profile coloc q15" (in this order at the final commit of the hack-surface, train-speed
# and variants issues): the hack-surface issue's guard (learn: results/x2/layout/), the variants (results/x2/variants/),
# the train-speed issue's before/after (results/x2/train_speed/). "before" is grpo_sglang.py and reward_fns.py at d7f3a11 (git show d7f3a11:FILE), carried to the
# machine in .gpukit/before/; "after" is the working tree. Runs of one pair alternate, on the same server.
# BEFORE= another script to pair against, e.g. .gpukit/before_dc2cabb/grpo_sglang.py (beside its reward_fns.py:
# git show dc2cabb:{grpo_sglang.py,reward_fns.py}) for the
# cuDNN-attention switch of 16561e3: BEFORE=.gpukit/before_dc2cabb/grpo_sglang.py PHASES="profile speed coloc"
BEFORE=${BEFORE:-.gpukit/before/grpo_sglang.py}
pair() { # name timeout, then flags: SCRIPT=before, then after, one after the other
  local name=$1 t=$2; shift 2
  SCRIPT=$BEFORE train ${name}_before /tmp/r/${name}_b "$t" "$@"
  train ${name}_after /tmp/r/${name}_a "$t" "$@"; }
speed() {  # the SmolLM2 pairs, the server alone on GPU 1
  serve_dedicated 0.15
  local U=(--server_url http://127.0.0.1:30010 --server_gpu 1 --steps 30 --eval_every 0)
  pair speed_smol_noasync 300 "${SMOL[@]}" "${U[@]}" --no-async
  pair speed_smol_async 300 "${SMOL[@]}" "${U[@]}" --async
  log "speed done"
}
profile() {  # where the SmolLM2 train phase goes (--no-async, steps 8-10 profiled): results/tools/profile_train.py
  serve_dedicated 0.15
  log "profile"
  timeout 300 python3 -m torch.distributed.run --nproc_per_node 1 --master_port 29533 results/tools/profile_train.py \
    --out "$RES/profile" --profile_steps 8-10 -- "${SMOL[@]}" --server_url http://127.0.0.1:30010 --server_gpu 1 \
    --steps 12 --eval_every 0 --no-async --out_dir /tmp/r/prof > "$RES/profile.log" 2>&1
  log "profile: exit $?"
  PIDFILE=/tmp/grpo_gpu_test.pid bash serve.sh stop >> "$RES/pipeline.log" 2>&1
}
q15() {  # the 1.5B-shaped pair: 24 x 8, 1024 new tokens, micro-batch 8, --no-async, server on GPU 1
  [ -d "$M/qwen2.5-1.5b-random" ] || make_model qwen2.5-1.5b-random 300 make_models.log
  serve q15 1 30011 "$M/qwen2.5-1.5b-random" 0.3
  pair speed_q15 600 --model "$M/qwen2.5-1.5b-random" --server_url http://127.0.0.1:30011 "${BIG[@]}" --steps 6 \
    --micro_batch 8 --max_new_tokens 1024 --no-async
  stop q15
  log "q15 done"
}
learn() {  # SmolLM2 async, 100 steps, seeds 0 (alone: its step time is the guard's), 1 and 2 (together, two servers)
  make_model qwen2.5-1.5b-random 300 make_models.log & MK=$!  # GPU 0 builds it while GPU 1 starts SmolLM2's server
  serve_dedicated 0.15
  wait $MK
  train smol_async_seed0 /tmp/r/l0 400 "${SMOL[@]}" --server_url http://127.0.0.1:30010 --server_gpu 1 --steps 100 \
    --eval_every 50 --async --seed 0
  GPU=1 SERVERS=2 PORT=30013 MODEL="$K" MEM_FRACTION=0.15 LOG="$RES/serve_seeds.log" PIDFILE=/tmp/serve_seeds.pid \
    timeout 600 bash serve.sh >> "$RES/pipeline.log" 2>&1 &
  gpu_tests 500
  wait
  for k in 1 2; do
    train smol_async_seed$k /tmp/r/l$k 400 "${SMOL[@]}" --server_url http://127.0.0.1:$((30012 + k)) --server_gpu 1 \
      --steps 100 --eval_every 50 --async --seed $k &
  done
  wait
  log "learn done"
}
# PHASES=variants (after learn: its three servers on GPU 1): each variant alone for 40 steps, three at a time (one
# server each; their step times are those of three runs sharing both GPUs), then all of them together for 100 steps.
variants() {
  local V=("--lr_schedule cosine --lr_warmup_steps 5 --min_lr_ratio 0.1" "--entropy_coef 0.001" "--mask_truncated"
           "--overlong_buffer 32" "--filter_flat_groups" "--tis_mode sequence_mask" "--adv_estimator rloo --scale_rewards none"
           "--loss_type cispo --clip_high 3" "--scale_rewards batch" "--reward arithmetic:1,format:0.1") P=(30010 30013 30014)
  for i in 0 1 2 3 4 5 6 7 8; do
    # shellcheck disable=SC2086
    train variant_$i /tmp/r/v$i 400 "${SMOL[@]}" --server_url http://127.0.0.1:${P[$((i % 3))]} --server_gpu 1 --steps 40 \
      --eval_every 40 --async ${V[$i]} &
    [ $((i % 3)) = 2 ] && wait
  done
  # the last variant beside all of them together (100 steps)
  # shellcheck disable=SC2086
  train variant_9 /tmp/r/v9 400 "${SMOL[@]}" --server_url http://127.0.0.1:30013 --server_gpu 1 --steps 40 \
    --eval_every 40 --async ${V[9]} &
  # shellcheck disable=SC2086
  train variants_all /tmp/r/vall 600 "${SMOL[@]}" --server_url http://127.0.0.1:30010 --server_gpu 1 --steps 100 \
    --eval_every 50 --async ${V[0]} --entropy_coef 0.001 --mask_truncated --overlong_buffer 32 --filter_flat_groups \
    --tis_mode sequence_mask --adv_estimator rloo --scale_rewards batch --loss_type cispo --clip_high 3 \
    --reward arithmetic:1,format:0.1 &
  wait
  PIDFILE=/tmp/serve_seeds.pid bash serve.sh stop >> "$RES/pipeline.log" 2>&1  # the dedicated server stays for speed
  log "variants done"
}
final() {  # the final commit on a fresh machine: SmolLM2 async seed 0 (the layout guard's run) and the GPU tests
  serve_dedicated 0.15
  train smol_async_final /tmp/r/f0 400 "${SMOL[@]}" --server_url http://127.0.0.1:30010 --server_gpu 1 --steps 100 \
    --eval_every 50 --async --seed 0
  gpu_tests 300
  log "final done"
}
nan() {  # pytorch/pytorch#196678 on this GPU: cuDNN attention's backward with the trainer's masks, old and packed
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 results/tools/sdpa_nan_check.py > "$RES/sdpa_nan_check.jsonl" 2> "$RES/sdpa_nan_check.log"
  log "sdpa_nan_check: exit $? ($(grep -c '"grad_q_nonfinite": [1-9]' "$RES/sdpa_nan_check.jsonl") cases with NaN grad_q)"
}
coloc() {  # the colocated before/after of the train-speed issue: server and trainer on GPU 0
  serve coloc 0 30000 "$K" 0.3
  CUDA_VISIBLE_DEVICES=0 pair speed_coloc 300 "${SMOL[@]}" --server_url http://127.0.0.1:30000 --colocate --async \
    --steps 30 --eval_every 0
  stop coloc
  log "coloc done"
}

# PHASES=train_speed_final: every number of the train-speed issue's summary in one pipeline, d7f3a11 (.gpukit/before/)
# against the working tree: the SmolLM2 --no-async pair (server alone on GPU 1), the colocated pair, three SmolLM2
# seeds at once (one server each on GPU 1; their step times share GPU 0), the GPU tests, the 1.5B pair, the 7B pair.
train_speed_final() {
  make_model qwen2.5-1.5b-random,qwen2.5-7b-random 400 make_models.log & MK=$!  # GPU 0, before anything is timed
  serve_dedicated 0.15
  GPU=1 SERVERS=2 PORT=30013 MODEL="$K" MEM_FRACTION=0.15 LOG="$RES/serve_seeds.log" PIDFILE=/tmp/serve_seeds.pid \
    timeout 600 bash serve.sh >> "$RES/pipeline.log" 2>&1
  wait $MK
  pair speed_smol_noasync 300 "${SMOL[@]}" --server_url http://127.0.0.1:30010 --server_gpu 1 --steps 30 --eval_every 0 \
    --no-async
  coloc
  local P=(30010 30013 30014)
  for k in 0 1 2; do
    train smol_async_seed$k /tmp/r/l$k 400 "${SMOL[@]}" --server_url http://127.0.0.1:${P[$k]} --server_gpu 1 --steps 100 \
      --eval_every 50 --async --seed $k &
  done
  wait
  PIDFILE=/tmp/serve_seeds.pid bash serve.sh stop >> "$RES/pipeline.log" 2>&1
  serve q15 1 30011 "$M/qwen2.5-1.5b-random" 0.3 & Q=$!  # loads while the GPU tests run
  gpu_tests 400
  PIDFILE=/tmp/grpo_gpu_test.pid bash serve.sh stop >> "$RES/pipeline.log" 2>&1
  wait $Q
  pair speed_q15 600 --model "$M/qwen2.5-1.5b-random" --server_url http://127.0.0.1:30011 "${BIG[@]}" --steps 6 \
    --micro_batch 8 --max_new_tokens 1024 --no-async
  stop q15
  serve q7 1 30012 "$M/qwen2.5-7b-random" 0.4
  # 7B, checkpointing: a run's last checkpoint (~91 GB with AdamW's moments) would not fit the disk, so each run is
  # ended once its last step is logged (the runs' metrics end there)
  local F=(--model "$M/qwen2.5-7b-random" --server_url http://127.0.0.1:30012 "${BIG[@]}" --prompts_per_step 16
           --steps 6 --micro_batch 8 --grad_checkpointing --no-async)
  for v in before after; do
    ( until grep -qs '"step": 6,' "/tmp/r/speed_q7_$v/metrics.jsonl"; do sleep 2; done; sleep 3
      pkill -f "out_dir /tmp/r/speed_q7_$v" ) & W=$!
    if [ $v = before ]; then SCRIPT=$BEFORE train speed_q7_$v /tmp/r/speed_q7_$v 600 "${F[@]}"
    else train speed_q7_$v /tmp/r/speed_q7_$v 600 "${F[@]}"; fi
    kill $W 2>/dev/null; rm -rf "/tmp/r/speed_q7_$v"
  done
  stop q7
  log "train_speed_final done"
}

if [ "${PHASES:-all}" = all ]; then
  phase_a & A=$!
  phase_b & B=$!
  wait $A $B
  phase_c
  phase_d
else
  for p in $PHASES; do "$p"; done  # one or more of the functions above, e.g. PHASES="check_async layout"
fi
log "all done"
