#!/usr/bin/env bash
# `poot serve --backend cuda` under load on the GPU machine: bench/serve_load.py at K = 1, 16, 64
# concurrent streaming clients, SmolLM2 (chat prompts) and the Llama-3.2-1B shape (random bf16
# weights, 32-token id prompts). Built here first by
#   python bench/gpu_run/serve_under_load_build.py   -> .cache/gpu/serve, .cache/gpu/gguf0..2
#
#   calls 1-3, carry [".cache/gpu/gguf<i>"]:  bash bench/gpu_run/stage_gguf.sh
#   call 4,    carry [".cache/gpu/serve"]:    bash bench/gpu_run/serve_under_load.sh
#
# Out: serve_{smollm2,llama1b}_k{1,16,64}.json (serve_load's JSON with --server-metrics),
# logs/ (the servers' stderr: one line per request). Loopback only. SERVE_SECONDS (default 20),
# SERVE_MODELS (default "smollm2 llama1b"; llama1b alone needs no staged GGUF). SERVE_PROFILE=1:
# while K = 64 runs, the server's and the load client's CPU seconds by thread (cpu_NAME.json,
# cpu_client_NAME.json) and then a py-spy
# profile (pyspy_NAME.raw, summarized in pyspy_NAME.json) by bench/gpu_run/thread_profile.py.
# SERVE_KS (default "1 16 64"). SERVE_SWITCH_INTERVALS="0.005 0.0001": each model served once a
# value of POOT_SERVE_SWITCH_INTERVAL (the GIL's switch interval); the files' NAME gets
# _si<value>. SERVE_POOT=DIR: the server runs from DIR, with DIR's poot package and model files
# (an older tree's, for an A/B on one machine; its compiled steps must hash the same);
# SERVE_ENV="VAR=value ...": the server's environment has these too. SERVE_TAG: a suffix for
# the files' NAME. SERVE_LOAD_PROCS=P: serve_load.py's --procs (the
# clients in P processes; default 4: one process fell behind a GPU server at 64 clients). SERVE_NO_C_HTTP=1: httptools and uvloop removed
# first (uvicorn then runs h11 on asyncio's loop, as without them).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/serve_under_load}"
mkdir -p "$OUT/logs"
B=.cache/gpu/serve
[ -f "$B/manifest.json" ] || { echo "serve_under_load: carry $B" >&2; exit 2; }
MODELS="${SERVE_MODELS:-smollm2 llama1b}"
GGUF=/tmp/gguf/smollm2.gguf
case " $MODELS " in *" smollm2 "*) [ -f "$GGUF" ] || { echo "serve_under_load: $GGUF is missing: \
stage_gguf.sh first" >&2; exit 2; } ;; esac
PY=python3
$PY -m pip install -q --no-index --no-deps --target /tmp/serve_site $B/wheels/*.whl 2>&1 | tail -2
export PYTHONPATH=.:/tmp/serve_site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export PATH=/tmp/serve_site/bin:$PATH
[ "${SERVE_NO_C_HTTP:-0}" = 1 ] && rm -rf /tmp/serve_site/httptools* /tmp/serve_site/uvloop*
$PY -c "import fastapi, uvicorn, prometheus_client, httpx" || { echo "serve_under_load: the serve \
wheels do not import" >&2; exit 2; }
[ -d /tmp/serve_cache ] || cp -r "$B/cache" /tmp/serve_cache
export POOT_CACHE_DIR=/tmp/serve_cache
SECONDS_EACH="${SERVE_SECONDS:-20}"
PORT=8765
FAILED=()

serve_and_load() {  # NAME LOADARGS -- SERVEARGS...   (SI: a switch interval, or empty)
    local served=$1 load=$2; shift 2
    local name=$served${SI:+_si$SI}${SERVE_TAG:-}
    local t=$(date +%s)
    # from SERVE_POOT's folder: `python -m` puts the working directory first on sys.path
    (cd "${SERVE_POOT:-.}" && POOT_SERVE_SWITCH_INTERVAL=${SI:-} exec env ${SERVE_ENV:-} \
        $PY -m poot.cli serve \
        --backend cuda --port $PORT --max-batch 64 --kv-capacity 512 --no-warm-up \
        --served-model-name "$served" "$@") > "$OUT/logs/server_$name.log" 2>&1 &
    local pid=$!
    if ! $PY - <<PYEOF
import os, time, urllib.request, sys
t = time.time()
while time.time() - t < 240:
    if not os.path.exists("/proc/$pid") or \
            open("/proc/$pid/stat").read().split()[2] == "Z":
        print("the server exited"); sys.exit(1)
    try:
        if urllib.request.urlopen("http://127.0.0.1:$PORT/health", timeout=5).status == 200:
            print("ready after %.1f s" % (time.time() - t)); sys.exit(0)
    except Exception:
        pass
    time.sleep(1)
sys.exit(1)
PYEOF
    then
        tail -n 20 "$OUT/logs/server_$name.log" >&2; kill -9 $pid; FAILED+=("$name:start"); return
    fi
    # a short pass at K = 64 first: every bucket's step loaded from the cache (discarded)
    timeout 120 $PY bench/serve_load.py --url http://127.0.0.1:$PORT -k 64 -m 4 $load \
        > "$OUT/logs/warm_$name.json" 2>&1
    for k in ${SERVE_KS:-1 16 64}; do
        timeout 200 $PY bench/serve_load.py --url http://127.0.0.1:$PORT -k $k \
            -m "$SECONDS_EACH" --procs "${SERVE_LOAD_PROCS:-4}" --server-metrics $load \
            > "$OUT/serve_${name}_k$k.json" \
            2> "$OUT/logs/load_${name}_k$k.err" &
        local lp=$!
        [ "$k" = 64 ] && [ "${SERVE_PROFILE:-0}" = 1 ] && profile "$name" $pid $lp
        wait $lp || FAILED+=("$name:k$k")
        $PY -c "import json; r = json.load(open('$OUT/serve_${name}_k$k.json')); \
print('$name K=$k', r['requests_per_s'], 'req/s', r['output_tokens_per_s'], 'tok/s', \
'ttft p50', r['ttft_s']['p50'], 'itl p50', r['itl_s']['p50'], 'errors', r['errors'], \
r.get('server'))" >&2 || true
    done
    kill -TERM $pid; wait $pid; echo "   $name: server exit $? after $(( $(date +%s) - t ))s" >&2
    tail -n 3 "$OUT/logs/server_$name.log" >&2
}

profile() {  # NAME PID LOADPID: within the K = 64 run (SERVE_SECONDS >= 16)
    sleep 3
    local client=$(pgrep -P $3 | head -1)        # the load client under `timeout`
    $PY bench/gpu_run/thread_profile.py cpu ${client:-$3} 5 > "$OUT/cpu_client_$1.json" &
    $PY bench/gpu_run/thread_profile.py cpu $2 5 > "$OUT/cpu_$1.json"
    wait $!
    py-spy record -p $2 -d 5 -r 250 --threads --nonblocking -f raw -o "$OUT/pyspy_$1.raw" \
        > /dev/null 2>&1
    $PY bench/gpu_run/thread_profile.py summarize "$OUT/pyspy_$1.raw" > "$OUT/pyspy_$1.json"
}

for SI in ${SERVE_SWITCH_INTERVALS:-default}; do [ "$SI" = default ] && SI=; for m in $MODELS; do
    case $m in
        smollm2) serve_and_load smollm2 "--max-tokens 64" --model "$GGUF" ;;
        llama1b) serve_and_load llama1b "--max-tokens 64 --token-prompts 32" \
            --model bench/shapes/llama-3.2-1b.json --random-weights bf16 ;;
        *) echo "serve_under_load: unknown model $m" >&2; FAILED+=("$m") ;;
    esac
done; done
echo "serve_under_load: done; failed: ${FAILED[*]:-none}" >&2
[ ${#FAILED[@]} -eq 0 ]
