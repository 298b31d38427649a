#!/bin/bash
# Host placement and wgpu: does wgpu's run-to-run spread on SmolLM2 (0.26-0.47x CUDA) follow where the host
# thread runs? CUDA and wgpu side by side (bench/gpu_run/backends.py), unpinned and pinned
# with taskset to cores of the GPU's NUMA node and of another node. Build here first (see
# bench/gpu_run/README.md, "CUDA, raw Vulkan and wgpu"): .cache/gpu/backends/{gl,whl,caps.json,cache}; run there carrying
# .cache/gpu/backends. Writes $OUT/topo.txt and one backends JSON per placement.
set -u
C=.cache/gpu/backends
O=${OUT:-/tmp/backends_pinned}; mkdir -p "$O"
for f in $C/gl/*.deb; do dpkg -x "$f" /; done; ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site $C/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD XDG_RUNTIME_DIR=/tmp \
    VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json \
    __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
# the GPU's NUMA node and the cores this process may use in it and elsewhere
read -r LOCAL1 LOCAL4 REMOTE4 < <(python3 - <<'PY'
import glob, os, subprocess
bus = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.split()[0].lower()[-12:]
try:
    node = int(open(f"/sys/bus/pci/devices/{bus}/numa_node").read())
except OSError:
    node = -1
allowed = sorted(os.sched_getaffinity(0))
def cpus(n):
    out = set()
    for part in open(f"/sys/devices/system/node/node{n}/cpulist").read().strip().split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return out
nodes = sorted(int(p.rsplit("node", 1)[1]) for p in glob.glob("/sys/devices/system/node/node*"))
local = [c for c in allowed if node < 0 or c in cpus(node)] or allowed
remote = [c for n in nodes if n != node for c in allowed if c in cpus(n)] or allowed[-4:]
j = lambda cs: ",".join(map(str, cs))
print(j(local[:1]), j(local[:4]), j(remote[:4]))
PY
)
{ nvidia-smi topo -m; lscpu | head -30; echo "allowed: $(taskset -pc $$)";
  echo "local1=$LOCAL1 local4=$LOCAL4 remote4=$REMOTE4"; } > "$O/topo.txt" 2>&1
cat "$O/topo.txt" | tail -3
B="bench/gpu_run/backends.py"
A="$PWD/$C/cache --tokens 128 --only smollm2 --backends cuda,wgpu --no-profile"
run() { local name=$1; shift; echo "== $name"; "$@" python3 $B "$O/$name.json" $A 2>&1 | grep -v "^  profile" | tail -4; }
case "${1:-placements}" in
placements)
    run unpinned_a env
    run local1 taskset -c "$LOCAL1"
    run local4 taskset -c "$LOCAL4"
    run remote4 taskset -c "$REMOTE4"
    run unpinned_b env
    run local4_b taskset -c "$LOCAL4" ;;
single)            # one core vs two vs all, on other cores
    run core0 taskset -c 0
    run core7 taskset -c 7
    run core13 taskset -c 13
    run cores0_1 taskset -c 0,1
    run unpinned_c env ;;
seeds)             # is the spread per process? the same hash seed twice, three seeds
    A="$PWD/$C/cache --tokens 128 --only smollm2 --backends wgpu --no-profile"
    for s in 0 0 1 1 2 2; do run "seed$s-$RANDOM" env PYTHONHASHSEED=$s; done ;;
alternate)         # does a CUDA run just before change wgpu's? both, then wgpu alone
    for i in 1 2 3; do run "both$i" env; done
    A="$PWD/$C/cache --tokens 128 --only smollm2 --backends wgpu --no-profile"
    for i in 1 2; do run "alone$i" env; done ;;
esac
