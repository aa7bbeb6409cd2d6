#!/usr/bin/env bash
# Start the SGLang server(s) that grpo_sglang.py trains against, on their own GPUs; wait until they
# really answer; return. Then: torchrun --nproc_per_node 3 grpo_sglang.py
#
#   bash serve.sh                        # GPU 3, Qwen/Qwen2.5-0.5B-Instruct, 127.0.0.1:30000
#   GPU=0 MEM_FRACTION=0.3 bash serve.sh # one GPU shared with the trainer (then: grpo_sglang.py --colocate)
#   GPU=2,3 TP=2 bash serve.sh           # one tensor-parallel server on GPUs 2 and 3 (--server_gpu 2+3)
#   GPU=2,3 SERVERS=2 bash serve.sh      # two servers, GPU 2 on port 30000 and GPU 3 on 30001
#   GPU=1 SERVERS=2 MEM_FRACTION=0.4 bash serve.sh   # two servers sharing GPU 1
#   MODEL=/path/to/model bash serve.sh -- --context-length 4096   # anything after -- goes to SGLang
#   bash serve.sh stop                   # stops every server this PIDFILE started
#
# Settings (environment): MODEL, GPU, TP, SERVERS, HOST, PORT, MEM_FRACTION, ATTENTION_BACKEND, DTYPE, SEED,
# FP32_LM_HEAD, SGLANG_API_KEY, EXTRA_ARGS, TIMEOUT (seconds to wait), LOG, PIDFILE, PYTHON.
# Server k takes TP GPUs of the GPU list from position k*TP (wrapping around, so that servers can share GPUs) and
# port PORT+k. At the end it prints the trainer's --server_url and --server_gpu for them.
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
GPU=${GPU:-3}
TP=${TP:-1}                        # GPUs per server (SGLang's --tp-size)
SERVERS=${SERVERS:-1}
HOST=${HOST:-127.0.0.1}            # loopback only: the weight-update endpoints must not face a network
PORT=${PORT:-30000}
MEM_FRACTION=${MEM_FRACTION:-0.85} # of the GPU for weights + KV cache; lower it when colocated or shared
ATTENTION_BACKEND=${ATTENTION_BACKEND:-}
DTYPE=${DTYPE:-bfloat16}           # the trainer pushes bf16 weights
SEED=${SEED:-0}
FP32_LM_HEAD=${FP32_LM_HEAD:-1}    # logits in fp32, as the trainer computes them (see grpo_sglang.shard)
TIMEOUT=${TIMEOUT:-900}
LOG=${LOG:-serve.log}
PIDFILE=${PIDFILE:-serve.pid}
PYTHON=${PYTHON:-python3}

pids() { [ -f "$PIDFILE" ] && cat "$PIDFILE" || true; }
alive() { local p; for p in $(pids); do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
log_of() { if [ "$1" = 0 ]; then echo "$LOG"; else echo "${LOG%.log}_$1.log"; fi; }

if [ "${1:-}" = "stop" ]; then
  if alive; then
    for pid in $(pids); do
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true   # the whole process group
    done
    for pid in $(pids); do
      for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
      kill -KILL -- "-$pid" 2>/dev/null || true
      echo "[serve.sh] stopped server (pid $pid)"
    done
  else
    echo "[serve.sh] no server running (pid file $PIDFILE)"
  fi
  rm -f "$PIDFILE"
  exit 0
fi
[ "${1:-}" = "--" ] && shift
case "$TP$SERVERS" in *[!0-9]*) echo "[serve.sh] TP and SERVERS must be numbers (TP=$TP SERVERS=$SERVERS)" >&2; exit 1;; esac
IFS=, read -ra GPUS <<< "$GPU"
if [ "$TP" -lt 1 ] || [ "$SERVERS" -lt 1 ] || [ "${#GPUS[@]}" -lt "$TP" ]; then
  echo "[serve.sh] TP=$TP needs at least $TP GPUs in GPU=$GPU (and TP, SERVERS >= 1)" >&2
  exit 1
fi

# Asks /health_generate (a real forward pass), not just /health: a server is ready when it generates.
healthy() {
  "$PYTHON" - "$1" <<'PY'
import os, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/health_generate")
if os.environ.get("SGLANG_API_KEY"):
    req.add_header("Authorization", "Bearer " + os.environ["SGLANG_API_KEY"])
try:
    sys.exit(0 if urllib.request.urlopen(req, timeout=10).status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

URLS=() SGPUS=() FLAGS=() LOGS=()
for k in $(seq 0 $((SERVERS - 1))); do
  gpus=()
  for j in $(seq 0 $((TP - 1))); do gpus+=("${GPUS[$(( (k * TP + j) % ${#GPUS[@]} ))]}"); done
  URLS+=("http://$HOST:$((PORT + k))") SGPUS+=("$(IFS=,; echo "${gpus[*]}")") FLAGS+=("$(IFS=+; echo "${gpus[*]}")")
  LOGS+=("$(log_of "$k")")
done

if alive; then
  echo "[serve.sh] already running (pid $(pids | tr '\n' ' ')) at ${URLS[*]}; 'bash serve.sh stop' first to change it"
  all=1; for u in "${URLS[@]}"; do healthy "$u" || all=0; done
  [ "$all" = 1 ] && exit 0
fi

: > "$PIDFILE"
start=$(date +%s)
# Servers that share a GPU start one after another: each sizes its KV cache from the memory it finds free, and two
# sizing at once both count the same memory (seen on an H200: the second then refused to start).
share=$(( SERVERS * TP > ${#GPUS[@]} ))
wait_healthy() { # k: until server k answers; exit 1 (stopping them all) if it dies or TIMEOUT passes
  local k=$1 pid; pid=$(sed -n "$((k + 1))p" "$PIDFILE")
  until healthy "${URLS[$k]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "[serve.sh] the server on GPU ${SGPUS[$k]} exited during start-up. Last lines of ${LOGS[$k]}:" >&2
      tail -n 30 "${LOGS[$k]}" >&2
      bash "${BASH_SOURCE[0]}" stop > /dev/null 2>&1 || true  # the others too
      exit 1
    fi
    if [ $(( $(date +%s) - start )) -ge "$TIMEOUT" ]; then
      echo "[serve.sh] not healthy after ${TIMEOUT}s (raise TIMEOUT?). Last lines of ${LOGS[$k]}:" >&2
      tail -n 30 "${LOGS[$k]}" >&2
      exit 1
    fi
    sleep 3
  done
  echo "[serve.sh] healthy after $(( $(date +%s) - start ))s: ${URLS[$k]} serves $MODEL on GPU ${SGPUS[$k]} (pid $pid, log ${LOGS[$k]})"
}
for k in "${!URLS[@]}"; do
  args=(--model-path "$MODEL" --host "$HOST" --port "$((PORT + k))" --mem-fraction-static "$MEM_FRACTION"
        --dtype "$DTYPE" --random-seed "$SEED")
  [ "$TP" -gt 1 ] && args+=(--tp-size "$TP")
  [ "$FP32_LM_HEAD" = 1 ] && args+=(--enable-fp32-lm-head)
  [ -n "$ATTENTION_BACKEND" ] && args+=(--attention-backend "$ATTENTION_BACKEND")
  [ -n "${SGLANG_API_KEY:-}" ] && args+=(--api-key "$SGLANG_API_KEY")
  # shellcheck disable=SC2206
  [ -n "${EXTRA_ARGS:-}" ] && args+=($EXTRA_ARGS)
  args+=("$@")
  shown="${args[*]}"; [ -n "${SGLANG_API_KEY:-}" ] && shown=${shown//"$SGLANG_API_KEY"/***}
  echo "[serve.sh] CUDA_VISIBLE_DEVICES=${SGPUS[$k]} $PYTHON -m sglang.launch_server $shown > ${LOGS[$k]}"
  # setsid: its own process group, so 'stop' ends the server and all its workers, and it outlives this shell
  CUDA_VISIBLE_DEVICES=${SGPUS[$k]} setsid nohup "$PYTHON" -m sglang.launch_server "${args[@]}" > "${LOGS[$k]}" 2>&1 < /dev/null &
  echo $! >> "$PIDFILE"
  [ "$share" = 1 ] && wait_healthy "$k"
done

[ "$share" = 1 ] || for k in "${!URLS[@]}"; do wait_healthy "$k"; done
if [ "$SERVERS" -gt 1 ] || [ "$TP" -gt 1 ]; then
  echo "[serve.sh] trainer flags: --server_url $(IFS=,; echo "${URLS[*]}") --server_gpu $(IFS=,; echo "${FLAGS[*]}")"
fi
