#!/usr/bin/env bash
# On the GPU machine: stage the SmolLM2 GGUF that carry.py split into .cache/gpu/gguf0..N-1
# (built here by any *_build.py that needs it). One call per part, back to back on the same
# held machine (a carried path is gone in the next call; /tmp stays while the machine is held):
#   call i, carry [".cache/gpu/gguf<i>"]:  bash bench/gpu_run/stage_gguf.sh
# Each call copies its part to /tmp/gguf; the call that completes the set joins them into
# /tmp/gguf/smollm2.gguf and checks its sha256 (exit 1 on a mismatch: parts of two builds).
set -u
cd "$(dirname "$0")/../.."
D=/tmp/gguf
mkdir -p "$D"
n=0
for p in .cache/gpu/gguf*/smollm2.part*; do
    [ -f "$p" ] && cp "$p" "$D/" && cp "$(dirname "$p")/gguf.json" "$D/" && n=$((n + 1))
done
[ $n -gt 0 ] || { echo "stage_gguf: no part here: carry .cache/gpu/gguf0, gguf1, ... one a call" >&2; exit 2; }
python3 - "$D" <<'PY'
import glob, hashlib, json, os, sys
d = sys.argv[1]
info = json.load(open(os.path.join(d, "gguf.json")))
have = sorted(glob.glob(os.path.join(d, "smollm2.part*")), key=lambda p: int(p.rsplit("part", 1)[1]))
print(f"stage_gguf: {len(have)} of {info['parts']} parts in {d}")
if len(have) < info["parts"]:
    sys.exit(0)
data = b"".join(open(p, "rb").read() for p in have)
if hashlib.sha256(data).hexdigest() != info["sha256"]:
    sys.exit("stage_gguf: the joined GGUF does not match its sha256 (parts from different builds?)")
open(os.path.join(d, "smollm2.gguf"), "wb").write(data)
print(f"stage_gguf: {d}/smollm2.gguf ({len(data)} bytes, sha256 ok)")
PY
