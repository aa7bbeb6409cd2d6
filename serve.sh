#!/usr/bin/env bash
# Start the SGLang server that grpo_sglang.py trains against, on its own GPU; wait until it
# really answers; return. Then: torchrun --nproc_per_node 3 grpo_sglang.py
#
#   bash serve.sh                        # GPU 3, Qwen/Qwen2.5-0.5B-Instruct, 127.0.0.1:30000
#   GPU=0 MEM_FRACTION=0.3 bash serve.sh # one GPU shared with the trainer (then: grpo_sglang.py --colocate)
#   MODEL=/path/to/model bash serve.sh -- --context-length 4096   # anything after -- goes to SGLang
#   bash serve.sh stop
#
# Settings (environment): MODEL, GPU, HOST, PORT, MEM_FRACTION, ATTENTION_BACKEND, DTYPE, SEED, FP32_LM_HEAD,
# SGLANG_API_KEY, EXTRA_ARGS, TIMEOUT (seconds to wait), LOG, PIDFILE, PYTHON.
# The trainer's --model and --server_url must name the same model and port.
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
GPU=${GPU:-3}
HOST=${HOST:-127.0.0.1}            # loopback only: the weight-update endpoints must not face a network
PORT=${PORT:-30000}
MEM_FRACTION=${MEM_FRACTION:-0.85} # of the GPU for weights + KV cache; lower it when colocated
ATTENTION_BACKEND=${ATTENTION_BACKEND:-}
DTYPE=${DTYPE:-bfloat16}           # the trainer pushes bf16 weights
SEED=${SEED:-0}
FP32_LM_HEAD=${FP32_LM_HEAD:-1}    # logits in fp32, as the trainer computes them (see grpo_sglang.shard)
TIMEOUT=${TIMEOUT:-900}
LOG=${LOG:-serve.log}
PIDFILE=${PIDFILE:-serve.pid}
PYTHON=${PYTHON:-python3}
URL="http://$HOST:$PORT"

alive() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

if [ "${1:-}" = "stop" ]; then
  if alive; then
    pid=$(cat "$PIDFILE")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid"   # the whole process group
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    echo "[serve.sh] stopped server (pid $pid)"
  else
    echo "[serve.sh] no server running (pid file $PIDFILE)"
  fi
  rm -f "$PIDFILE"
  exit 0
fi
[ "${1:-}" = "--" ] && shift

# Asks /health_generate (a real forward pass), not just /health: the server is ready when it generates.
healthy() {
  "$PYTHON" - "$URL" <<'PY'
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

if alive; then
  echo "[serve.sh] already running (pid $(cat "$PIDFILE")) at $URL; 'bash serve.sh stop' first to change it"
  healthy && exit 0
fi

args=(--model-path "$MODEL" --host "$HOST" --port "$PORT" --mem-fraction-static "$MEM_FRACTION"
      --dtype "$DTYPE" --random-seed "$SEED")
[ "$FP32_LM_HEAD" = 1 ] && args+=(--enable-fp32-lm-head)
[ -n "$ATTENTION_BACKEND" ] && args+=(--attention-backend "$ATTENTION_BACKEND")
[ -n "${SGLANG_API_KEY:-}" ] && args+=(--api-key "$SGLANG_API_KEY")
# shellcheck disable=SC2206
[ -n "${EXTRA_ARGS:-}" ] && args+=($EXTRA_ARGS)
args+=("$@")

shown="${args[*]}"; [ -n "${SGLANG_API_KEY:-}" ] && shown=${shown//"$SGLANG_API_KEY"/***}
echo "[serve.sh] CUDA_VISIBLE_DEVICES=$GPU $PYTHON -m sglang.launch_server $shown > $LOG"
# setsid: its own process group, so 'stop' ends the server and all its workers, and it outlives this shell
CUDA_VISIBLE_DEVICES=$GPU setsid nohup "$PYTHON" -m sglang.launch_server "${args[@]}" > "$LOG" 2>&1 < /dev/null &
echo $! > "$PIDFILE"

start=$(date +%s)
until healthy; do
  if ! alive; then
    echo "[serve.sh] the server exited during start-up. Last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    rm -f "$PIDFILE"
    exit 1
  fi
  if [ $(( $(date +%s) - start )) -ge "$TIMEOUT" ]; then
    echo "[serve.sh] not healthy after ${TIMEOUT}s (raise TIMEOUT?). Last lines of $LOG:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
  sleep 3
done
echo "[serve.sh] healthy after $(( $(date +%s) - start ))s: $URL serves $MODEL on GPU $GPU (pid $(cat "$PIDFILE"), log $LOG)"
