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

#   step_log NAME SECONDS CMD...
# the same, with CMD's stdout and stderr both in $OUT/logs/NAME.log (CMD writes its own result
# file), a line before it starts, and the log's last lines after.
T0=${T0:-$(date +%s)}
step_log() {
  local name=$1 limit=$2; shift 2
  local t=$(date +%s)
  echo "== $name (limit ${limit}s, at $((t - T0))s)" >&2
  timeout --kill-after=10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  tail -n 5 "$OUT/logs/$name.log" >&2
  if [ $rc -ne 0 ]; then
    [ $rc -eq 124 ] && echo "   $name ran past ${limit}s" >&2
    FAILED+=("$name:$rc")
  fi
  echo "   $name: exit $rc in $(( $(date +%s) - t ))s (log $OUT/logs/$name.log)" >&2
}
