# Step timing shared by .ci/run and .ci/background: each step's wall and
# CPU time (this shell's children: user + system), printed as the step
# ends and as a table at the end. Source it, then call `step NAME` before
# each step; the EXIT trap prints the table.
_step_name=""; _step_wall=0; _step_cpu=0; _ci_start=$(date +%s); _ci_table=""
_ci_times="$(mktemp)"
# times runs in this shell (a pipe would run it in a subshell, whose
# children are none of the steps').
_cpu_now() { times >"$_ci_times"; _cpu=$(tail -n 1 "$_ci_times" | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); t += a[1] * 60 + a[2] } printf "%.0f", t }'); }
_step_end() {
  if [ -n "$_step_name" ]; then
    _cpu_now
    local wall=$(( $(date +%s) - _step_wall )) cpu=$(( _cpu - _step_cpu ))
    printf -- '--- %s: %ds wall, %ds CPU\n' "$_step_name" "$wall" "$cpu"
    _ci_table+=$(printf '%6ds %6ds  %s' "$wall" "$cpu" "$_step_name")$'\n'
  fi
}
step() {
  _step_end
  _cpu_now
  _step_name="$*"; _step_wall=$(date +%s); _step_cpu=$_cpu
  printf '\n=== %s\n' "$*"
}
# _ci_summary prints the table and the exit status ($1, default $?);
# CI_TABLE_TITLE titles it.
_ci_summary() {
  local rc=${1:-$?}
  _step_end; _step_name=""
  _cpu_now
  printf '\n=== %s (wall, CPU)\n%s%6ds %6ds  total (exit %d)\n' "${CI_TABLE_TITLE:-time per step}" "$_ci_table" "$(( $(date +%s) - _ci_start ))" "$_cpu" "$rc"
  rm -f "$_ci_times"
}
