#!/usr/bin/env bash
# Start the SGLang server(s) that grpo_sglang.py trains against, on their own GPUs; wait until they
# really answer; return. Then: torchrun --nproc_per_node 3 grpo_sglang.py
#
#   bash serve.sh                        # GPU 3, Qwen/Qwen2.5-0.5B-Instruct, 127.0.0.1:30000
#   GPU=0 MEM_FRACTION=0.3 bash serve.sh # one GPU shared with the trainer (then: grpo_sglang.py --colocate)
#   GPU=2,3 TP=2 bash serve.sh           # one tensor-parallel server on GPUs 2 and 3 (--server_gpu 2+3)
#   GPU=2,3 SERVERS=2 bash serve.sh      # two servers, GPU 2 on port 30000 and GPU 3 on 30001
#   GPU=1 SERVERS=2 bash serve.sh        # two servers sharing GPU 1, at MEM_FRACTION 0.425 each (0.85 split)
#   GPU=2,3 TP=2 SERVERS=2 bash serve.sh # two TP-2 servers, both on GPUs 2 and 3
#   MODEL=/path/to/model bash serve.sh -- --context-length 4096   # anything after -- goes to SGLang
#   bash serve.sh stop                   # stops every server this PIDFILE started
#   bash serve.sh restart                # stops them and starts the same again: the last start's settings, printed
#                                        # (in PIDFILE.settings; one set now wins: MODEL=other bash serve.sh restart)
#
# Settings (environment): MODEL, GPU, TP, SERVERS, HOST, PORT, MEM_FRACTION, ATTENTION_BACKEND, DTYPE, SEED,
# FP32_LM_HEAD, SGLANG_API_KEY, EXTRA_ARGS, TIMEOUT (seconds to wait), LOG, PIDFILE, PYTHON.
# GPU: distinct GPU numbers separated by single commas (GPU=2,3). Server k takes TP GPUs of the list from position
# k*TP and port PORT+k. Servers share GPUs (the list wraps around) only evenly: when SERVERS*TP > the number of GPUs,
# that number must be a multiple of TP and SERVERS*TP a multiple of it; anything else is refused before any start.
# Servers sharing a GPU split the default MEM_FRACTION (0.85); one you set must fit: servers per GPU x it <= 0.9.
# At the end it prints the trainer's --server_url and --server_gpu for them. PORT..PORT+SERVERS-1 must be free.
set -euo pipefail

KEPT="MODEL GPU TP SERVERS HOST PORT MEM_FRACTION ATTENTION_BACKEND DTYPE SEED FP32_LM_HEAD EXTRA_ARGS TIMEOUT LOG"
KEPT+=" PYTHON"  # (all the settings but PIDFILE, whose name holds them, and SGLANG_API_KEY, a secret)
if [ "${1:-}" = "restart" ]; then  # the same servers again: the settings (not SGLANG_API_KEY) the last start wrote
  saved=${PIDFILE:-serve.pid}.settings
  [ -f "$saved" ] || { echo "[serve.sh] nothing to restart: no $saved (a start writes it): start with bash serve.sh" >&2
                       exit 1; }
  [ $# -eq 1 ] || [ "$2" = "--" ] || { echo "[serve.sh] restart takes SGLang's arguments after -- only (bash" \
                                          "serve.sh restart -- --context-length 4096), not: ${*:2}" >&2; exit 1; }
  now=(); for v in $KEPT; do [ -n "${!v+x}" ] && now+=("$v=${!v}"); done  # set on this command line: they win
  ARGS=()
  # shellcheck disable=SC1090
  source "$saved"
  changed=; for kv in ${now[@]+"${now[@]}"}; do
    v=${kv%%=*}; [ "${!v:-}" = "${kv#*=}" ] || changed+=" $v"
    export "${kv?}"
  done
  [ $# -gt 1 ] && ARGS=("${@:3}") && changed+=" the arguments after --"  # they replace the last start's
  shown=; for v in $KEPT; do [ -n "${!v:-}" ] && shown+=" $v=$(printf %q "${!v}")" && export "${v?}"; done
  echo "[serve.sh] restart with the settings of the last start ($saved${changed:+; set now:$changed}):$shown$(
       )${ARGS[*]:+ -- ${ARGS[*]}}"
  bash "${BASH_SOURCE[0]}" stop
  exec bash "${BASH_SOURCE[0]}" -- ${ARGS[@]+"${ARGS[@]}"}
fi

MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
GPU=${GPU:-3}
TP=${TP:-1}                        # GPUs per server (SGLang's --tp-size)
SERVERS=${SERVERS:-1}
HOST=${HOST:-127.0.0.1}            # loopback only: the weight-update endpoints must not face a network
PORT=${PORT:-30000}
MEM_SET=${MEM_FRACTION:+1}         # set by the user: checked, never split
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
die() { echo "[serve.sh] $*" >&2; exit 1; }

if [ "${1:-}" = "stop" ]; then
  if alive; then
    for pid in $(pids); do
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true   # the whole process group
    done
    for pid in $(pids); do
      for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done  # 30 s for it to end
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
case "$TP$SERVERS" in *[!0-9]*) die "TP and SERVERS must be numbers (TP=$TP SERVERS=$SERVERS)";; esac
TP=$((10#$TP)) SERVERS=$((10#$SERVERS))  # TP=08 is 8, not an octal error
[ "$SERVERS" -ge 1 ] || die "SERVERS=$SERVERS starts no server: write SERVERS=1 (the default) or more"
[ "$TP" -ge 1 ] || die "TP=$TP gives a server no GPU: write TP=1 (the default) or more"
[[ $PORT =~ ^0*[1-9][0-9]{0,4}$ ]] && PORT=$((10#$PORT)) && [ "$PORT" -le 65535 ] ||
  die "PORT=$PORT is not a port: write a whole number from 1 to 65535 (e.g. PORT=30000)"
[ $((PORT + SERVERS - 1)) -le 65535 ] || die "PORT=$PORT SERVERS=$SERVERS needs ports up to $((PORT + SERVERS - 1))," \
  "past 65535: write PORT=$((65536 - SERVERS)) or lower"
if ! [[ $TIMEOUT =~ ^0*[1-9][0-9]*$ ]]; then  # else [ -ge ] fails at every poll and the wait never ends
  fix=$(awk -v t="$TIMEOUT" 'BEGIN { u = substr(t, length(t)); n = (u ~ /[smh]/) ? substr(t, 1, length(t) - 1) : t
    v = n * (u == "m" ? 60 : u == "h" ? 3600 : 1)  # 15m: 900, 1.5h: 5400, 2.5: 3 (whole seconds, rounded up)
    print (n ~ /^[0-9]*\.?[0-9]+$/ && v > 0) ? (v == int(v) ? v : int(v) + 1) : 900 }')
  die "TIMEOUT=$TIMEOUT is not a whole number of seconds (1 or more): write e.g. TIMEOUT=$fix"
fi
command -v "$PYTHON" > /dev/null || die "PYTHON=$PYTHON is not a command: set PYTHON to the Python that has SGLang"
[[ $FP32_LM_HEAD =~ ^[01]$ ]] || die "FP32_LM_HEAD=$FP32_LM_HEAD is not 0 or 1: write FP32_LM_HEAD=1 (fp32 logits) or 0"
if ! [[ $GPU =~ ^[0-9]+(,[0-9]+)*$ ]]; then  # else GPU='2, 3' would start on CUDA_VISIBLE_DEVICES=' 3'
  case "$GPU" in
    *[[:space:]]*) what="has spaces";;
    ,*|*,|*,,*) what="has an empty entry";;
    *) what="has something other than GPU numbers and commas";;
  esac
  fix=$(grep -o '[0-9]\+' <<< "$GPU" | awk '!seen[$0 + 0]++' | paste -sd, -) || true  # its numbers, each once: 2,3
  [[ $fix =~ ^[0-9]+(,[0-9]+)*$ ]] || fix=2,3
  echo "[serve.sh] GPU='$GPU' $what: write GPU numbers separated by single commas, e.g. GPU=$fix" >&2
  exit 1
fi
IFS=, read -ra GPUS <<< "$GPU"
seen=, dup=
for g in "${GPUS[@]}"; do
  case "$seen" in *",$((10#$g)),"*) dup=${dup:-$g};; *) seen="$seen$((10#$g)),";; esac
done
if [ -n "$dup" ]; then
  echo "[serve.sh] GPU=$GPU lists GPU $dup twice: list each GPU once (GPU=${seen:1:-1});" \
       "for several servers on one GPU set SERVERS (e.g. GPU=$dup SERVERS=2)" >&2
  exit 1
fi
n=${#GPUS[@]}
if [ "$n" -lt "$TP" ]; then
  echo "[serve.sh] TP=$TP needs at least $TP GPUs in GPU=$GPU" >&2
  exit 1
fi
# the largest MEM_FRACTION for k servers on a GPU (k x it <= 0.9), with the decimals it needs not to read 0
mem_fit() { awk -v k="$1" 'BEGIN { d = 100; while (int(0.9 / k * d + 1e-6) == 0) d *= 10
                                     printf "%g", int(0.9 / k * d + 1e-6) / d }'; }
if [ $((SERVERS * TP)) -gt "$n" ] && { [ $((n % TP)) -ne 0 ] || [ $((SERVERS * TP % n)) -ne 0 ]; }; then
  on=() across=  # the servers on each position of the list; the first server across the end of the list
  for k in $(seq 0 $((SERVERS - 1))); do
    g=()
    for j in $(seq 0 $((TP - 1))); do p=$(( (k * TP + j) % n )); on[p]="${on[p]:+${on[p]},}$k" g+=("${GPUS[p]}"); done
    [ -z "$across" ] && [ $(( k * TP % n + TP )) -gt "$n" ] && across=", server $k across the end of the list" &&
      across+=" (GPUs $(IFS=,; echo "${g[*]}"))"
  done
  shared=
  for p in "${!GPUS[@]}"; do
    [[ ${on[p]:-} == *,* ]] && shared="${shared:+$shared, }servers ${on[p]} on GPU ${GPUS[p]}"
  done
  m=$n; while [ $((m % TP)) -ne 0 ] || [ $((SERVERS * TP % m)) -ne 0 ]; do m=$((m - 1)); done  # m = TP fits
  k=$((SERVERS * TP / m)) mem=  # a MEM_FRACTION set for fewer servers a GPU must shrink with the wrap
  [ -n "$MEM_SET" ] && awk -v v="$MEM_FRACTION" -v k="$k" 'BEGIN { exit !(v ~ /^[0-9]*\.?[0-9]+$/ && k * v > 0.9) }' &&
    mem=" at MEM_FRACTION=$(mem_fit "$k") or lower"
  echo "[serve.sh] GPU=$GPU TP=$TP SERVERS=$SERVERS would not share GPUs evenly: $shared$across; server k takes" \
       "TP GPUs from position k*TP of GPU, wrapping. Give each server its own GPUs (SERVERS=$((n / TP)), or" \
       "$((SERVERS * TP)) GPUs in GPU), or wrap evenly: GPU=$(IFS=,; echo "${GPUS[*]:0:m}") puts" \
       "$k servers on each GPU$mem" >&2
  exit 1
fi
per=$(( SERVERS * TP > n ? SERVERS * TP / n : 1 ))  # servers on each GPU
if ! awk -v v="$MEM_FRACTION" 'BEGIN { exit !(v ~ /^[0-9]*\.?[0-9]+$/ && v + 0 > 0 && v + 0 < 1) }'; then
  echo "[serve.sh] MEM_FRACTION=$MEM_FRACTION is not a number between 0 and 1: it is the share of each GPU's memory" \
       "that one server takes (e.g. MEM_FRACTION=0.4)" >&2
  exit 1
fi
if [ "$per" -gt 1 ] && [ -z "$MEM_SET" ]; then
  MEM_FRACTION=$(awk -v v="$MEM_FRACTION" -v k="$per" 'BEGIN { printf "%g", int(v / k * 10000 + 1e-6) / 10000 }')
  echo "[serve.sh] $per servers share each GPU: MEM_FRACTION $MEM_FRACTION each (0.85 split;" \
       "set MEM_FRACTION to choose)"
elif [ "$per" -gt 1 ] && awk -v v="$MEM_FRACTION" -v k="$per" 'BEGIN { exit !(k * v > 0.9 + 1e-9) }'; then
  fit=$(mem_fit "$per")
  echo "[serve.sh] $per servers share each GPU at MEM_FRACTION=$MEM_FRACTION, $per x $MEM_FRACTION of its memory:" \
       "more than 0.9. Set MEM_FRACTION=$fit or lower (or leave it unset: 0.85 is then split among them)" >&2
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

if alive; then  # never a second start over them: the pid file would lose them, and 'stop' with it
  all=1; for u in "${URLS[@]}"; do healthy "$u" || all=0; done
  [ "$all" = 1 ] && echo "[serve.sh] already running (pid $(pids | xargs)) at ${URLS[*]};" \
    "'bash serve.sh stop' first to change it" && exit 0
  die "the servers of $PIDFILE (pid $(pids | xargs)) are running but do not all answer at ${URLS[*]}: still" \
    "loading (see $LOG)? Wait for them, or 'bash serve.sh stop' first"
fi
# A port something already holds: SGLang would die there while the other server answered our health checks.
why=$("$PYTHON" - "$HOST" "$PORT" "$SERVERS" <<'PY'
import errno, socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def taken(p):  # -> why SGLang could not listen on host:p, or None
    try:
        family, kind, _, _, where = socket.getaddrinfo(host, p, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a port just freed counts as free
            s.bind(where)
    except OSError as e:
        return e
for p in range(port, port + n):
    if (e := taken(p)) and e.errno != errno.EADDRINUSE:
        sys.exit(print(f"cannot listen on HOST={host} ({e.strerror or e}): write a local address, e.g. HOST=127.0.0.1"))
    if e:
        free = next((q for q in range(p + 1, 65537 - n) if not any(taken(q + i) for i in range(n))), None)
        sys.exit(print(f"port {p} on {host} is in use (another server?): stop what holds it, or choose free ports"
                       + (f", e.g. PORT={free}" if free else "")))
PY
) || die "PYTHON=$PYTHON failed the port check above: set PYTHON to the Python that has SGLang"
[ -z "$why" ] || die "$why"

: > "$PIDFILE"
{ for v in $KEPT; do  # for 'restart': this start's settings (a MEM_FRACTION only if set: a split is redone)
    [ "$v" = MEM_FRACTION ] && [ -z "$MEM_SET" ] && continue
    printf '%s=%q\n' "$v" "${!v:-}"
  done
  printf 'ARGS=(%s)\n' "$(for a in "$@"; do printf '%q ' "$a"; done)"; } > "$PIDFILE.settings"
start=$(date +%s)
# Servers that share a GPU start one after another: each sizes its KV cache from the memory it finds free, and two
# sizing at once both count the same memory (seen on an H200: the second then refused to start).
share=$(( SERVERS * TP > ${#GPUS[@]} ))
fail() { # k, what went wrong: say it, show server k's log, stop them all, exit 1
  echo "[serve.sh] ${*:2}. Last lines of ${LOGS[$1]}:" >&2
  tail -n 30 "${LOGS[$1]}" >&2
  bash "${BASH_SOURCE[0]}" stop > /dev/null 2>&1 || true
  exit 1
}
wait_healthy() { # k: until server k answers; exit 1 (stopping them all) if it dies or TIMEOUT passes
  local k=$1 pid; pid=$(sed -n "$((k + 1))p" "$PIDFILE")
  until healthy "${URLS[$k]}" && kill -0 "$pid" 2>/dev/null; do  # an answer while it is gone is not its own
    kill -0 "$pid" 2>/dev/null || fail "$k" "the server on GPU ${SGPUS[$k]} exited during start-up"
    [ $(( $(date +%s) - start )) -lt "$TIMEOUT" ] || fail "$k" "the server on GPU ${SGPUS[$k]} was not healthy after" \
      "${TIMEOUT}s: stopped (still loading? raise TIMEOUT, e.g. TIMEOUT=$((TIMEOUT * 2)))"
    sleep 1  # (a check is one small request: each second costs nothing and says "healthy" sooner)
  done
  echo "[serve.sh] healthy after $(( $(date +%s) - start ))s: ${URLS[$k]} serves $MODEL on GPU ${SGPUS[$k]}" \
       "(pid $pid, log ${LOGS[$k]})"
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
  CUDA_VISIBLE_DEVICES=${SGPUS[$k]} setsid nohup "$PYTHON" -m sglang.launch_server "${args[@]}" > "${LOGS[$k]}" 2>&1 \
    < /dev/null &
  echo $! >> "$PIDFILE"
  [ "$share" = 1 ] && wait_healthy "$k"
done

[ "$share" = 1 ] || for k in "${!URLS[@]}"; do wait_healthy "$k"; done
if [ "$SERVERS" -gt 1 ] || [ "$TP" -gt 1 ]; then
  echo "[serve.sh] trainer flags: --server_url $(IFS=,; echo "${URLS[*]}") --server_gpu $(IFS=,; echo "${FLAGS[*]}")"
fi
