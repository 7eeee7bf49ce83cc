# Sourced by the launcher tests: wait for an event, never a fixed sleep.
# wait_for WHAT COMMAND...: polls COMMAND until it succeeds, at most $deadline_s seconds
# (the caller sets deadline_s and defines fail).
wait_for() {
    what=$1
    shift
    end=$(($(date +%s) + deadline_s))
    until "$@"; do
        test "$(date +%s)" -lt "$end" || fail "no $what within $deadline_s s"
        sleep 0.05
    done
}
