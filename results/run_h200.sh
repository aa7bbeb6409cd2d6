#!/usr/bin/env bash
# The exact commands behind results/: one H200, server and trainer colocated on GPU 0,
# SmolLM2-135M-Instruct from the ../shared/gpu kit (sglang 0.5.16), built-in task.
#   . .gpukit/a/env.sh && bash results/run_h200.sh main      # server, calibration, 100-step run
#   . .gpukit/a/env.sh && bash results/run_h200.sh negative  # negative controls (same server)
#   . .gpukit/a/env.sh && bash results/run_h200.sh bench     # bench.py: step, rollout, sync (small model)
#   . .gpukit/a/env.sh && bash results/run_h200.sh bench_large  # bench.py: sync of a random 1.4B model
#   . .gpukit/a/env.sh && bash results/run_h200.sh train_bench  # the train phase alone, no server
#                                                           # (results/tools/train_phase_bench.py), random
#                                                           # SmolLM2- and Qwen2.5-1.5B-shaped models, variants
#   . .gpukit/a/env.sh && setsid bash results/run_h200.sh train_speed > /tmp/res/pipeline.out 2>&1 &
#                                                           # the train-speed issue on one GPU (all five kit
#                                                           # chunks and .gpukit/before/): colocated pairs,
#                                                           # seeds, then train_bench; log /tmp/res/pipeline.log
#   . .gpukit/a/env.sh && setsid bash results/run_h200.sh varlen > /tmp/res/pipeline.out 2>&1 &
#                                                           # --attention varlen against sdpa (the kit's chunks)
#   . .gpukit/a/env.sh && NOW=<commit> setsid bash results/run_h200.sh gqa_head > /tmp/res/pipeline.out 2>&1 &
#                                                           # CUDA tests of the head and GQA varlen, train phase
#                                                           # of c8b26ce against NOW: smol, q15, q7 shapes
#   . .gpukit/a/env.sh && NOW=<commit> setsid bash results/run_h200.sh fused_norm > /tmp/res/pipeline.out 2>&1 &
#                                                           # fused RMSNorm: CUDA tests, train phase of e79e488
#                                                           # against NOW, colocated async pairs, seeds, 7B pair
#   . .gpukit/a/env.sh && setsid bash results/run_h200.sh head_bf16 > /tmp/res/pipeline.out 2>&1 &
#                                                           # --head_matmul bf16 against tf32: CUDA tests, train
#                                                           # phase, colocated pairs (sync check), bf16 seeds
#   . .gpukit/a/env.sh && bash results/run_h200.sh final     # fresh machine: server with decode graphs up to
#                                                           # 256, bench.py step + rollout on the final code
# Afterwards, on any machine (no GPU):
#   python3 bench.py --merge results/h200/bench_all results/h200/{bench,bench_large,bench_final}/bench.json
# Everything lands in /tmp/res, packed after each phase into $OUT/res.tgz (the device tool's folder).
set -uo pipefail
RES=/tmp/res
mkdir -p "$RES"
export GPU=0 MODEL=${KIT_MODEL_DIR:?run . .gpukit/a/env.sh first} MEM_FRACTION=0.3 ATTENTION_BACKEND=triton \
       EXTRA_ARGS="--sampling-backend pytorch --cuda-graph-max-bs-decode 160" LOG=$RES/serve.log PYTHONUNBUFFERED=1
TRAIN=(python3 -m torch.distributed.run --nproc_per_node 1 grpo_sglang.py --colocate --model "$MODEL"
       --dataset builtin --builtin_max_operand 20 --prompts_per_step 16 --group_size 8 --max_new_tokens 128
       --micro_batch 128 --lr 1e-5 --beta 0.04)
pack() { tar czf "${OUT:-/tmp}/res.tgz" -C "$RES" . ; }
trap pack EXIT
log() { echo "[$(date +%T)] $*" | tee -a "$RES/pipeline.log"; }
# run NAME SCRIPT FLAGS...: a colocated training run of SCRIPT (this grpo_sglang.py or an older commit's) on the server
run() { local name=$1 script=$2; shift 2; log "train $name: $*"
  timeout 400 python3 -m torch.distributed.run --nproc_per_node 1 --master_port $((20000 + RANDOM % 9000)) "$script" \
    "${TRAIN[@]:6}" --out_dir "/tmp/r/$name" "$@" > "$RES/$name.log" 2>&1
  log "train $name: exit $? ($(tail -n 1 "$RES/$name.log" | cut -c1-160))"
  cp "/tmp/r/$name/metrics.jsonl" "$RES/$name.metrics.jsonl" 2>/dev/null; pack; }

case "${1:-main}" in
main)
  { python3 -c "import sglang, torch, transformers, sys; print('python', sys.version.split()[0], '| sglang', sglang.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } | tee "$RES/versions.txt"
  SECONDS=0; bash serve.sh
  echo "server start: ${SECONDS} s" | tee -a "$RES/versions.txt"; SECONDS=0
  # How hard is 'a + b' for this model? Sampled (T=1, what GRPO trains on) and greedy accuracy.
  python3 - <<'PY' 2>&1 | tee "$RES/calibration.txt"
import os, collections, grpo_sglang as g, reward_fns
from transformers import AutoTokenizer
cfg = g.Config(model=os.environ["MODEL"], max_new_tokens=128)
tok = AutoTokenizer.from_pretrained(cfg.model)
for op in (9, 20, 50):
    rows = g.tokenize_rows(g.builtin_rows(op)[:64], tok, cfg, g.INSTRUCTIONS["arithmetic"], collections.Counter())
    acc = {}
    for name, n, greedy in (("sampled", 8, False), ("greedy", 1, True)):
        outs = g.generate(cfg, [r["ids"] for r in rows], n, greedy=greedy)
        rs = [reward_fns.arithmetic_reward(tok.decode(o[0], skip_special_tokens=True), rows[i // n]["answer"]) for i, o in enumerate(outs)]
        acc[name] = sum(rs) / len(rs)
    print(f"max_operand {op:3d}: sampled accuracy {acc['sampled']:.3f}  greedy {acc['greedy']:.3f}  (64 prompts)")
PY
  echo "calibration: ${SECONDS} s" | tee -a "$RES/versions.txt"; SECONDS=0
  "${TRAIN[@]}" --steps 100 --eval_every 50 --save_every 0 --out_dir /tmp/run_main 2>&1 | tee "$RES/train.log"
  echo "training run (model load, 100 steps, 3 evals, checkpoint): ${SECONDS} s" | tee -a "$RES/versions.txt"
  cp /tmp/run_main/metrics.jsonl "$RES/metrics.jsonl"
  ;;
negative)
  bash serve.sh   # already running: returns at once
  # 1) one push skipped (step 6): caught only if one step moves the probe more than kernel noise
  "${TRAIN[@]}" --steps 10 --eval_every 0 --save_every 0 --debug_skip_sync 6 --out_dir /tmp/run_neg1 > "$RES/negative_skip_one.log" 2>&1
  cp /tmp/run_neg1/metrics.jsonl "$RES/negative_skip_one_metrics.jsonl"
  # 2) pushes stop after step 3 (the classic "forgot to sync" bug): the check must stop the run
  "${TRAIN[@]}" --steps 40 --eval_every 0 --save_every 0 --debug_skip_sync 4-40 --out_dir /tmp/run_neg2 > "$RES/negative_stop_syncing.log" 2>&1
  cp /tmp/run_neg2/metrics.jsonl "$RES/negative_stop_syncing_metrics.jsonl"
  # 3) the default layout on a one-GPU machine: the server's GPU (3) is not there -> clear error
  python3 -m torch.distributed.run --nproc_per_node 1 grpo_sglang.py --model "$MODEL" > "$RES/layout_error.log" 2>&1
  tail -n 4 "$RES"/negative_*.log "$RES/layout_error.log"
  ;;
bench)
  python3 bench.py --model "$MODEL" --out "$RES/bench" --parts step,rollout,sync --no-large --reps 3 \
      --rollout_reps 2 --step_args --micro_batch 128 2>&1 | tail -n 40
  ;;
bench_large)
  python3 bench.py --model "$MODEL" --out "$RES/bench_large" --parts sync --no-small --reps 3 2>&1 | tail -n 30
  ;;
train_bench)  # only the kit's chunk c is needed (transformers); each variant packed as soon as it ends
  tb() { local name=$1; shift
    timeout "${TB_TIMEOUT:-300}" python3 -m torch.distributed.run --nproc_per_node 1 --master_port $((20000 + RANDOM % 9000)) \
      results/tools/train_phase_bench.py --out "$RES/bench_$name.json" "$@" > "$RES/bench_$name.log" 2>&1
    local rc=$?  # (before $(date ...), which would report its own status)
    echo "[$(date +%T)] $name: exit $rc $(tail -n 1 "$RES/bench_$name.log")" | tee -a "$RES/train_bench.log"; pack; }
  for v in ${TB_VARIANTS:-smol smol_reshard smol_compile q15 q15_reshard q15_compile}; do
    if [[ $v == *@* ]]; then  # SHAPE@COMMIT: that commit's grpo_sglang.py (copied to .gpukit/at-COMMIT/), side by side
      s=${v%@*}; n=30; mixed=(); [ "${s%_mixed}" = q15 ] && n=7; [ "$s" = q7 ] && n=8  # SHAPE: smol, q15, q15_mixed, q7
      [ "$s" != "${s%_mixed}" ] && n=10 && mixed=(--truncated 0.25)
      GRPO_SCRIPT=.gpukit/at-${v#*@}/grpo_sglang.py tb "${s}_at_${v#*@}" --shape "${s%_mixed}" --steps $n "${mixed[@]}"
      continue
    fi
    case $v in
      smol) tb smol --shape smol --profile "$RES/profile_smol" ;;
      smol_cudnn) tb smol_cudnn --shape smol --cudnn ;;
      smol_reshard) tb smol_reshard --shape smol --reshard ;;
      smol_compile) TORCH_LOGS=recompiles tb smol_compile --shape smol -- --compile ;;
      smol_compile_prof) TORCH_LOGS=recompiles tb smol_compile_prof --shape smol --profile "$RES/profile_smol_compile" \
          -- --compile ;;
      q15) tb q15 --shape q15 --steps 7 --profile "$RES/profile_q15" --profile_steps 6 ;;
      q15_reshard) tb q15_reshard --shape q15 --steps 7 --reshard ;;
      # the head's logits (--head_matmul: bf16 the default since f7ee041, tf32 before; run at 9a85e3e
      # as q15 / smol, with the tf32 default, and q15_bf16head / smol_bf16head)
      q15_tf32head) tb q15_tf32head --shape q15 --steps 7 --profile "$RES/profile_q15" --profile_steps 6 \
          -- --head_matmul tf32 ;;
      q15_bf16head) tb q15_bf16head --shape q15 --steps 7 -- --head_matmul bf16 ;;
      smol_tf32head) tb smol_tf32head --shape smol --profile "$RES/profile_smol" -- --head_matmul tf32 ;;
      smol_bf16head) tb smol_bf16head --shape smol -- --head_matmul bf16 ;;
      q7_tf32head) tb q7_tf32head --shape q7 --steps 8 -- --head_matmul tf32 ;;
      q7_bf16head) tb q7_bf16head --shape q7 --steps 8 -- --head_matmul bf16 ;;
      q15_compile_tf32head) TORCH_LOGS=recompiles tb q15_compile_tf32head --shape q15 --steps 8 -- --compile \
          --head_matmul tf32 ;;
      q15_compile_bf16head) TORCH_LOGS=recompiles tb q15_compile_bf16head --shape q15 --steps 8 -- --compile \
          --head_matmul bf16 ;;
      q15_compile) TORCH_LOGS=recompiles tb q15_compile --shape q15 --steps 8 -- --compile ;;
      q15_compile_again) TORCH_LOGS=recompiles tb q15_compile_again --shape q15 --steps 8 -- --compile ;;  # (warm caches)
      # --attention sdpa against the default (varlen where it applies); _mixed: a quarter of the completions at
      # 1024 tokens, the rest ~30 (lengths as a trained model's: packed rows with pads)
      smol_varlen) tb smol_varlen --shape smol -- --attention varlen ;;
      smol_sdpa) tb smol_sdpa --shape smol -- --attention sdpa ;;
      q15_varlen) tb q15_varlen --shape q15 --steps 7 -- --attention varlen ;;
      q15_sdpa) tb q15_sdpa --shape q15 --steps 7 -- --attention sdpa ;;
      q15_mixed) tb q15_mixed --shape q15 --steps 10 --truncated 0.25 ;;
      q15_mixed_sdpa) tb q15_mixed_sdpa --shape q15 --steps 10 --truncated 0.25 -- --attention sdpa ;;
      q15_compile_prof) TORCH_LOGS=recompiles tb q15_compile_prof --shape q15 --steps 8 --profile "$RES/profile_q15_compile" \
          --profile_steps 7 -- --compile ;;
      q7_memory) tb q7_memory --shape q7 --steps 5 --memory "$RES/peak_q7.txt" ;;  # what is live at the 7B peak
      q15_memory) tb q15_memory --shape q15 --steps 5 --memory "$RES/peak_q15.txt" ;;
      q15_mixed_compile) TORCH_LOGS=recompiles tb q15_mixed_compile --shape q15 --steps 10 --truncated 0.25 -- --compile ;;
      q15_mixed_compile_sdpa) TORCH_LOGS=recompiles tb q15_mixed_compile_sdpa --shape q15 --steps 10 --truncated 0.25 \
          -- --compile --attention sdpa ;;
    esac
  done
  ;;
train_speed)  # colocated before (BEFORE: d7f3a11's script) / after pairs, 30 steps each, alternating on one server;
  # SmolLM2 async 100 steps, seeds 0-2; then the train phase alone (train_bench, the server stopped)
  BEFORE=${BEFORE:-.gpukit/before/grpo_sglang.py}
  python3 -c "import sglang, torch, transformers; print('sglang', sglang.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)" > "$RES/versions.txt" 2>&1
  SECONDS=0; bash serve.sh >> "$RES/pipeline.log" 2>&1; log "server up after $SECONDS s"
  for mode in async no-async; do
    run "speed_coloc_${mode/-/}_before" "$BEFORE" --steps 30 --eval_every 0 --save_every 0 --$mode
    run "speed_coloc_${mode/-/}_after" grpo_sglang.py --steps 30 --eval_every 0 --save_every 0 --$mode
  done
  for k in 0 1 2; do run "smol_async_seed$k" grpo_sglang.py --steps 100 --eval_every 50 --save_every 0 --async --seed $k; done
  bash serve.sh stop >> "$RES/pipeline.log" 2>&1
  TB_VARIANTS=${TB_VARIANTS:-q15 q15_reshard smol smol_reshard smol_compile} TB_TIMEOUT=240 bash "$0" train_bench
  log "all done"
  ;;
varlen)  # --attention varlen (the default where it applies) against sdpa, one script, side by side on one machine:
  # the kernel's GPU test (and a broken copy of it that must fail), colocated async pairs, three SmolLM2 seeds, then
  # train_bench (the server stopped)
  run() { local name=$1; shift; log "train $name: $*"
    timeout 400 python3 -m torch.distributed.run --nproc_per_node 1 --master_port $((20000 + RANDOM % 9000)) \
      grpo_sglang.py "${TRAIN[@]:6}" --out_dir "/tmp/r/$name" "$@" > "$RES/$name.log" 2>&1
    log "train $name: exit $? ($(tail -n 1 "$RES/$name.log" | cut -c1-160))"
    cp "/tmp/r/$name/metrics.jsonl" "$RES/$name.metrics.jsonl" 2>/dev/null; pack; }
  python3 -c "import sglang, torch, transformers; print('sglang', sglang.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)" > "$RES/versions.txt" 2>&1
  timeout 300 python3 -m pytest -q -s test_smoke.py -k varlen_kernel > "$RES/gpu_test_varlen.log" 2>&1
  log "gpu test: exit $? ($(tail -n 1 "$RES/gpu_test_varlen.log"))"
  rm -rf /tmp/broken && mkdir -p /tmp/broken && cp grpo_sglang.py reward_fns.py test_smoke.py /tmp/broken/
  sed -i 's/window_size=(left, 0))/window_size=(left, -1))/' /tmp/broken/grpo_sglang.py  # not causal: must fail
  (cd /tmp/broken && timeout 300 python3 -m pytest -q -s test_smoke.py -k varlen_kernel) > "$RES/gpu_test_varlen_broken.log" 2>&1
  log "gpu test, not causal (must fail): exit $? ($(tail -n 1 "$RES/gpu_test_varlen_broken.log"))"
  SECONDS=0; bash serve.sh >> "$RES/pipeline.log" 2>&1; log "server up after $SECONDS s"
  for a in sdpa varlen; do run "speed_coloc_async_$a" --steps 30 --eval_every 0 --save_every 0 --async --attention $a; done
  for k in 0 1 2; do run "smol_async_seed$k" --steps 100 --eval_every 50 --save_every 0 --async --seed $k; done
  bash serve.sh stop >> "$RES/pipeline.log" 2>&1
  TB_VARIANTS=${TB_VARIANTS:-q15_mixed q15_mixed_sdpa q15_varlen q15_sdpa smol_varlen smol_sdpa q15_mixed_compile \
    q15_mixed_compile_sdpa q15_compile_prof smol_compile} TB_TIMEOUT=240 bash "$0" train_bench
  log "all done"
  ;;
gqa_head)  # 4a5c26c (the head's backward without bf16 copies of W and dW) and 0d711fb (GQA in the varlen kernel) on
  # the GPU: the CUDA tests (and a broken copy that must fail), then the train phase alone (train_bench) of
  # c8b26ce's trainer and this one, side by side: SmolLM2, 1.5B and 7B shapes (time and peak memory). Needs the kit's
  # chunk c only, and .gpukit/at-c8b26ce/ and .gpukit/at-$NOW/ (NOW: this commit) with their grpo_sglang.py.
  python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)" > "$RES/versions.txt" 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$RES/versions.txt"
  timeout 300 python3 -m pytest -q -s test_smoke.py -k "varlen_kernel or head_logprobs_on_cuda" > "$RES/gpu_tests.log" 2>&1
  log "gpu tests: exit $? ($(tail -n 1 "$RES/gpu_tests.log"))"
  rm -rf /tmp/broken && mkdir -p /tmp/broken && cp grpo_sglang.py reward_fns.py test_smoke.py /tmp/broken/
  # kv heads tiled (query head h reads kv head h % Hkv, not h // group): the CUDA test must fail
  sed -i 's/out = varlen_attn(q, k, v,/out = varlen_attn(q, k.repeat(1, H \/\/ k.shape[1], 1), v.repeat(1, H \/\/ v.shape[1], 1),/' \
    /tmp/broken/grpo_sglang.py
  grep -c "k.repeat(1, H // k.shape" /tmp/broken/grpo_sglang.py >> "$RES/gpu_tests_broken.log"
  (cd /tmp/broken && timeout 300 python3 -m pytest -q -s test_smoke.py -k varlen_kernel) >> "$RES/gpu_tests_broken.log" 2>&1
  log "gpu test, kv heads tiled (must fail): exit $? ($(tail -n 1 "$RES/gpu_tests_broken.log"))"; pack
  : "${NOW:?set NOW=<commit>}"
  TB_VARIANTS=${TB_VARIANTS:-"smol@c8b26ce smol@$NOW q15@c8b26ce q15@$NOW q7@c8b26ce q7@$NOW"} TB_TIMEOUT=420 bash "$0" train_bench
  log "all done"
  ;;
fused_norm)  # fuse_rms_norms (torch's fused RMSNorm) on the GPU: the CUDA tests, the train phase alone of BASE's
  # trainer and NOW's side by side (SmolLM2 and 1.5B shapes), colocated SmolLM2 async pairs (BASE, NOW) on one server
  # for the sync check's mismatch and the step, three NOW seeds of 100 steps, then the 7B pair. Needs all the kit's
  # chunks, and .gpukit/at-$BASE/ and .gpukit/at-$NOW/ with their grpo_sglang.py.
  : "${NOW:?set NOW=<commit>}" "${BASE:=e79e488}"
  python3 -c "import sglang, torch, transformers; print('sglang', sglang.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)" > "$RES/versions.txt" 2>&1
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$RES/versions.txt"
  timeout 300 python3 -m pytest -q -s test_smoke.py -k "fused_rms or head_logprobs_on_cuda or varlen_kernel" > "$RES/gpu_tests.log" 2>&1
  log "gpu tests: exit $? ($(tail -n 1 "$RES/gpu_tests.log"))"; pack
  TB_VARIANTS="smol@$BASE smol@$NOW q15@$BASE q15@$NOW" TB_TIMEOUT=300 bash "$0" train_bench
  SECONDS=0; bash serve.sh >> "$RES/pipeline.log" 2>&1; log "server up after $SECONDS s"
  for k in 1 2; do
    run "coloc_async_${BASE}_$k" ".gpukit/at-$BASE/grpo_sglang.py" --steps 30 --eval_every 0 --save_every 0 --async
    run "coloc_async_${NOW}_$k" ".gpukit/at-$NOW/grpo_sglang.py" --steps 30 --eval_every 0 --save_every 0 --async
  done
  for k in 0 1 2; do run "smol_async_seed$k" grpo_sglang.py --steps 100 --eval_every 50 --save_every 0 --async --seed $k; done
  bash serve.sh stop >> "$RES/pipeline.log" 2>&1
  TB_VARIANTS="q7@$BASE q7@$NOW" TB_TIMEOUT=420 bash "$0" train_bench
  log "all done"
  ;;
head_bf16)  # --head_matmul bf16 against tf32 (the default before f7ee041), one script, side by side: the head's CUDA tests, the
  # train phase alone (1.5B and SmolLM2 shapes), colocated async pairs for the sync check's mismatch, three bf16 seeds
  log "gpu tests: $(timeout 300 python3 -m pytest -q -s test_smoke.py -k "head_logprobs_on_cuda or fused_rms" 2>&1 \
    | tee "$RES/gpu_tests.log" | tail -n 1)"; pack
  TB_VARIANTS="q15_tf32head q15_bf16head smol_tf32head smol_bf16head" TB_TIMEOUT=240 bash "$0" train_bench
  SECONDS=0; bash serve.sh >> "$RES/pipeline.log" 2>&1; log "server up after $SECONDS s"
  for k in 1 2; do for h in tf32 bf16; do
    run "coloc_async_${h}_$k" grpo_sglang.py --steps 30 --eval_every 0 --save_every 0 --async --head_matmul $h
  done; done
  for k in 0 1 2; do
    run "smol_async_bf16_seed$k" grpo_sglang.py --steps 100 --eval_every 50 --save_every 0 --async --seed $k --head_matmul bf16
  done
  bash serve.sh stop >> "$RES/pipeline.log" 2>&1
  log "all done"
  ;;
final)
  EXTRA_ARGS="--sampling-backend pytorch --cuda-graph-max-bs-decode 256" bash serve.sh
  python3 bench.py --model "$MODEL" --out "$RES/bench_final" --parts step,rollout --rollout_batches 128,256 \
      --rollout_reps 2 --step_args --micro_batch 128 2>&1 | tail -n 25
  ;;
esac
