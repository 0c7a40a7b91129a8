# tests/lib/slurm_lib.sh — the helpers test_slurm.sh and test_slurm2.sh share: sourced after
# tests/lib/lib.sh, with TOP (the source tree), WORK (the test's directory) and T_END (the test's
# deadline, date +%s) set. Every Slurm command runs under a timeout, so a wedged slurmctld
# fails the test instead of hanging it. Sets CLUSTER (empty until the caller starts one) and
# the traps that stop the cluster and remove WORK on every exit.
CLUSTER=""
cleanup() {
    [ -z "$CLUSTER" ] || "$TOP/tests/lib/slurm_cluster.sh" stop "$CLUSTER"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# left SECS: SECS, or fewer if the test deadline comes first (at least 1)
left() {
    local r=$((T_END - $(date +%s)))
    [ "$r" -lt "$1" ] || r=$1
    [ "$r" -ge 1 ] || r=1
    echo "$r"
}
# wait_until SECS CMD...: poll CMD every half second; false on timeout
wait_until() {
    local end=$(($(date +%s) + $(left "$1")))
    shift
    until "$@"; do
        [ "$(date +%s)" -lt $end ] || return 1
        sleep 0.5
    done
}
gone() { [ -z "$(timeout 10 squeue -h -j "$1" -o %i 2> /dev/null)" ]; }
running() { [ "$(timeout 10 squeue -h -j "$1" -o %T 2> /dev/null)" = RUNNING ]; }
has_step() { [ -f "$1" ] && grep -q '"event":"step"' "$1"; }
# field JOB NAME: a field of `scontrol show job` (JobState, ExitCode, Restarts, ...)
field() { timeout 10 scontrol -o show job "$1" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
# submit NAME ARGS...: sbatch a job named NAME logging to $WORK/NAME.out; prints the job id
submit() {
    local name=$1
    shift
    timeout 20 sbatch --parsable -J "$name" -o "$WORK/$name.out" -D "$WORK" -t 5 "$@" | cut -d';' -f1
}
# wait_job ID SECS WHAT: wait until the job has left the queue; on timeout cancel it, say so
wait_job() {
    if wait_until "$2" gone "$1"; then return 0; fi
    bad "$3" "job $1 still $(timeout 10 squeue -h -j "$1" -o %T) after $2 s; cancelled"
    timeout 10 scancel "$1" 2> /dev/null
    return 1
}
# step numbers of a metrics file: first, last, and the "end" line's count
first_step() { grep -m1 '"event":"step"' "$1" | sed 's/.*"step":\([0-9]*\).*/\1/'; }
last_step() { grep '"event":"step"' "$1" | tail -n 1 | sed 's/.*"step":\([0-9]*\).*/\1/'; }
end_steps() { grep '"event":"end"' "$1" | sed 's/.*"steps":\([0-9]*\).*/\1/'; }
export PIPELM_RUNS=$WORK/runs
