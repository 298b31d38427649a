# Sourced by the bench/gpu_run/*.sh scripts (needs $OUT with a logs/ folder):
#   step NAME SECONDS CMD...
# runs CMD with a time limit, its stdout to $OUT/NAME and stderr to $OUT/logs/NAME.log, prints
# the log's last lines and the exit status, and adds "NAME:status" to FAILED when it failed.
FAILED=()
step() {
  local name=$1 limit=$2; shift 2
  local t=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name" 2> "$OUT/logs/$name.log"
  local rc=$?
  tail -n 3 "$OUT/logs/$name.log" >&2
  [ $rc -ne 0 ] && FAILED+=("$name:$rc")
  echo "   $name: exit $rc in $(( $(date +%s) - t ))s" >&2
}
