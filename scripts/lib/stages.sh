# Stages of a long script (scripts/test): each starts under a header, ends with a line giving
# its verdict and time, and the script closes with every stage's time and an `N passed,
# N failed` line. A failed stage does not stop the ones after it, so one run reports every
# failure; the script's exit status is 1 if any stage failed.
#   . scripts/lib/stages.sh
#   stage "Rust tests" cargo test --release --workspace --locked
#   stages_verdict

stages_passed=0
stages_failed=0
stages_report=()

# The time in seconds as minutes and seconds, e.g. 3m07s.
stages_clock() {
  printf '%dm%02ds' $(($1 / 60)) $(($1 % 60))
}

# Runs the command after NAME as stage NAME, in a subshell: what it exports stays in it.
stage() {
  local name="$1" started=$SECONDS status
  shift
  echo "=== stage: $name"
  # Not `(...) || status=$?`: bash ignores `set -e` inside a command tested by `||`, so a
  # function stage would go on past its first failure.
  set +e
  (set -e; "$@")
  status=$?
  set -e
  stages_record "$name" "$started" "$status"
}

# Runs the command after NAME as stage NAME in this shell (setup that exports what later stages
# need); the script ends at once if it fails, since nothing after it could run.
stage_setup() {
  local name="$1" started=$SECONDS status=0
  shift
  echo "=== stage: $name"
  "$@" || status=$?
  stages_record "$name" "$started" "$status"
  [ "$status" -eq 0 ] || stages_verdict
}

# Counts and reports stage NAME, started at second STARTED, ended with STATUS.
stages_record() {
  local name="$1" took verdict
  took="$(stages_clock $((SECONDS - $2)))"
  if [ "$3" -eq 0 ]; then
    stages_passed=$((stages_passed + 1))
    verdict="passed"
  else
    stages_failed=$((stages_failed + 1))
    verdict="FAILED (exit status $3)"
  fi
  echo "=== stage: $name: $verdict in $took"
  stages_report+=("$(printf '%-44s %8s  %s' "$name" "$took" "${verdict%% (*}")")
}

# Prints every stage's time and verdict and the counts; exits 1 if a stage failed.
stages_verdict() {
  echo "=== stages"
  printf '%s\n' "${stages_report[@]}"
  echo "=== $stages_passed passed, $stages_failed failed, in $(stages_clock "$SECONDS")"
  [ "$stages_failed" -eq 0 ] || exit 1
}
