#!/bin/bash
# test_slurm.sh — the Slurm workflow on a private one-node cluster (tests/lib/slurm_cluster.sh):
#   1. dry runs of jobs/train.sbatch, jobs/bench.sbatch and jobs/local.sh, and the fail-fast
#      outside Slurm (no cluster needed);
#   2. a tiny jobs/train.sbatch job: its log (loss lines, stage table), metrics and checkpoints;
#   3. preemption machinery with a stand-in pipelm (a shell script): SIGUSR1 to the batch shell
#      reaches the step, exit 75 makes the script requeue, the requeued job resumes and ends;
#   4. the same with the real pipelm (only where `pipelm train --help` lists --ckpt-dir): it
#      saves a checkpoint, exits 75, is requeued, resumes from the saved step, finishes;
#   5. a small jobs/bench.sbatch sweep into one CSV (only where pipelm bench has --warmup).
# Skipped (77) without the slurm-wlm and munge packages, or when not root. Every wait is
# bounded, and the whole test stops its waits at a deadline (DEADLINE_S, default 280 s).
. "$(dirname "$0")/../lib/lib.sh"
TOP=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
[ -x "$PIPELM" ] || PIPELM=$TOP/build/pipelm
for c in sbatch squeue scontrol scancel sinfo slurmctld slurmd munged mungekey; do
    if ! command -v $c > /dev/null; then
        echo "SKIP: $c not found (apt-get install slurm-wlm munge slurmctld slurmd slurm-client)"
        exit 77
    fi
done
if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: a private slurmd needs root"
    exit 77
fi
[ -x "$PIPELM" ] || { echo "FAIL: no pipelm binary at $PIPELM"; exit 1; }
cd "$WORK" || exit 1
T_END=$(($(date +%s) + ${DEADLINE_S:-280}))

. "$TOP/tests/lib/slurm_lib.sh"

# ---- 1. dry runs and the fail-fast, no cluster -----------------------------------------------
out=$(env -u SLURM_JOB_ID "$TOP/jobs/train.sbatch" --preset tiny 2>&1)
rc=$?
if [ $rc -ne 0 ] && grep -q "not inside a Slurm job" <<< "$out"; then
    ok "train.sbatch outside Slurm fails fast (exit $rc) and says why"
else
    bad "train.sbatch outside Slurm" "exit $rc: $out"
fi
out=$(env -u SLURM_JOB_ID PIPELM_DRY_RUN=1 PIPELM_NTASKS=3 "$TOP/jobs/train.sbatch" --preset tiny --steps 5 2>&1)
if grep -q -- "^+ srun --mpi=pmi2 --ntasks=3 .* train --preset tiny --steps 5" <<< "$out" &&
    grep -q "scontrol requeue" <<< "$out" && [ ! -d "$WORK/runs" ]; then
    ok "train.sbatch dry run prints the srun line and runs nothing"
else
    bad "train.sbatch dry run" "$out"
fi
out=$(env -u SLURM_JOB_ID PIPELM_DRY_RUN=1 PIPELM_NTASKS=3 PIPELM_MICROBATCHES="2 4" \
    "$TOP/jobs/bench.sbatch" --preset tiny 2>&1)
n=$(grep -c -- "^+ srun .* bench --preset tiny .*--json" <<< "$out")
if [ "$n" -eq 12 ] && grep -q -- "--ntasks=3 .* --schedule gpipe --microbatches 4" <<< "$out" &&
    ! grep -q -- "--ntasks=4" <<< "$out"; then
    ok "bench.sbatch dry run: 2 schedules x 2 micro-batch counts x stages 1 2 3 = 12 runs"
else
    bad "bench.sbatch dry run" "$n bench lines: $out"
fi
out=$(PIPELM_DRY_RUN=1 "$TOP/jobs/local.sh" train -n 2 --preset tiny 2>&1)
if grep -q -- "^+ .*mpiexec -n 2 .* train --preset tiny" <<< "$out"; then
    ok "local.sh dry run prints the mpiexec line"
else
    bad "local.sh dry run" "$out"
fi

# ---- the cluster ----------------------------------------------------------------------------
if ! env_out=$("$TOP/tests/lib/slurm_cluster.sh" start 2> cluster.err); then
    bad "start the Slurm cluster" "$(tail -n 15 cluster.err)"
    finish
    exit
fi
eval "$env_out"
CLUSTER=$SLURM_CLUSTER_DIR
ok "Slurm cluster up ($(sinfo -h -o '%n %T %c CPUs'))"

# ---- 2. a tiny training job ----------------------------------------------------------------------
job=$(submit train -n 2 --oversubscribe --export=ALL,PIPELM="$PIPELM" "$TOP/jobs/train.sbatch" \
    --preset tiny --steps 30 --ckpt-every 10 --log-every 10 --progress 0)
if [ -z "$job" ]; then
    bad "sbatch train.sbatch" "no job id"
elif wait_job "$job" 150 "tiny training job"; then
    run=$WORK/runs/train-$job
    state="$(field "$job" JobState) $(field "$job" ExitCode)"
    [ "$state" = "COMPLETED 0:0" ] && ok "tiny job $job completed" || bad "tiny job state" "$state; $(tail -n 5 train.out)"
    n=$(grep -c '^step .*/30 | loss [0-9.]*' train.out)
    [ "$n" -eq 3 ] && ok "log has the loss lines (steps 10, 20, 30)" || bad "loss lines" "$n of 3 in the log"
    if grep -q "stage  rank  blocks" train.out && [ "$(grep -cE '^ +[01] +[01] +[0-9]' train.out)" -eq 2 ]; then
        ok "log has the stage table with 2 stages"
    else
        bad "stage table" "$(head -n 12 train.out)"
    fi
    grep -q -- "--cpus-per-task=1 .*--metrics $run/metrics.jsonl" train.out &&
        ok "the step got --cpus-per-task and a metrics file in the run directory" ||
        bad "srun line" "$(grep '^+ srun' train.out)"
    [ "$(losses "$run/metrics.jsonl" | wc -l)" -eq 30 ] && [ "$(end_steps "$run/metrics.jsonl")" = 30 ] &&
        ok "metrics: 30 step lines and an end line" || bad "metrics" "$(tail -n 2 "$run/metrics.jsonl" 2>&1)"
    latest=$(cat "$run/ckpt/latest" 2> /dev/null)
    nck=$(find "$run/ckpt" -name 'ckpt_*.h5' 2> /dev/null | wc -l)
    if [ -n "$latest" ] && [ -f "$run/ckpt/$(basename "$latest")" ] && [ "$nck" -ge 3 ] &&
        [ -f "$run/ckpt/ckpt_00000030.h5" ]; then
        ok "checkpoints: $nck files, latest = $(basename "$latest")"
    else
        bad "checkpoint directory" "latest='$latest', files: $(ls "$run/ckpt" 2>&1 | tr '\n' ' ')"
    fi
fi

# ---- 3. preemption machinery with a stand-in pipelm --------------------------------------------
# It counts steps (0.2 s each), writes metrics and a `latest` file like pipelm, and on SIGUSR1
# or SIGTERM "saves" and exits 75; with --resume it starts after the step named in latest.
mkdir -p stub
cat > stub/pipelm <<'EOF'
#!/bin/bash
[ "${1:-}" = train ] && shift
case " $* " in *" --help "*) echo "  --ckpt-dir S  --resume [S]"; exit 0 ;; esac
steps=10 ckpt="" metrics=/dev/null resume=0
while [ $# -gt 0 ]; do
    case $1 in
    --steps) steps=$2; shift ;;
    --ckpt-dir) ckpt=$2; shift ;;
    --metrics) metrics=$2; shift ;;
    --resume) resume=1 ;;
    esac
    shift
done
rank=${SLURM_PROCID:-0}
start=1
[ $resume = 1 ] && start=$(($(sed 's/^ckpt_0*\([0-9][0-9]*\)\.h5$/\1/' "$ckpt/latest") + 1))
stop=0
trap 'stop=1' USR1 TERM
for ((s = start; s <= steps; s++)); do
    sleep 0.2
    if [ "$rank" = 0 ]; then
        echo "{\"event\":\"step\",\"step\":$s,\"loss\":1.0}" >> "$metrics"
        echo "step $s/$steps | loss 1.0"
    fi
    if [ $stop = 1 ]; then
        [ "$rank" = 0 ] && printf 'ckpt_%08d.h5\n' $s > "$ckpt/latest" && echo "stub: saved at step $s"
        exit 75
    fi
done
[ "$rank" = 0 ] && echo "{\"event\":\"end\",\"steps\":$steps}" >> "$metrics"
exit 0
EOF
chmod +x stub/pipelm

# preempt NAME JOB SECS: wait until JOB runs and has logged a step, then SIGUSR1 to its batch
# shell; wait until it has been requeued, resumed and left the queue
preempt() {
    local name=$1 job=$2 secs=$3 run=$WORK/runs/$1-$2
    if ! wait_until 60 eval "running $job && has_step $run/metrics.jsonl"; then
        bad "$name: job $job never ran a step" "$(squeue -h -j "$job" -o '%T %r'); $(tail -n 5 "$name.out" 2>&1)"
        scancel "$job" 2> /dev/null
        return 1
    fi
    scancel --signal=USR1 --batch "$job"
    wait_job "$job" "$secs" "$name: preempted job"
}
# check_resumed NAME JOB STEPS: the log, restart count and the two metrics files tell that the
# job stopped with exit 75, was requeued, and resumed at the saved step to finish STEPS
check_resumed() {
    local name=$1 job=$2 steps=$3 run=$WORK/runs/$1-$2
    local state restarts saved first
    state="$(field "$job" JobState) $(field "$job" ExitCode)"
    restarts=$(field "$job" Restarts)
    [ "$state" = "COMPLETED 0:0" ] && [ "$restarts" = 1 ] &&
        ok "$name: job $job completed after 1 requeue" || bad "$name: job state" "$state, Restarts=$restarts"
    grep -q "got SIGUSR1" "$name.out" && grep -q "(exit 75): requeueing job $job" "$name.out" &&
        ok "$name: SIGUSR1 forwarded, exit 75, requeued" || bad "$name: log" "$(grep "train.sbatch" "$name.out")"
    grep -q "^+ srun .* --resume$" "$name.out" && grep -q "checkpoint found" "$name.out" &&
        ok "$name: the requeued job ran with --resume" || bad "$name: resume" "$(grep '^+ srun' "$name.out")"
    saved=$(last_step "$run/metrics.jsonl")
    first=$(first_step "$run/metrics.restart1.jsonl" 2> /dev/null)
    if [ -n "$saved" ] && [ "$saved" -lt "$steps" ] && [ "$first" = $((saved + 1)) ]; then
        ok "$name: stopped after step $saved, resumed at step $first"
    else
        bad "$name: resume point" "first run ended at '$saved', second began at '$first'"
    fi
    [ "$(end_steps "$run/metrics.restart1.jsonl" 2> /dev/null)" = "$steps" ] &&
        [ "$(last_step "$run/metrics.restart1.jsonl")" = "$steps" ] &&
        ok "$name: all $steps steps done" || bad "$name: final step" "$(tail -n 2 "$run/metrics.restart1.jsonl" 2>&1)"
}

# the stand-in's requeue repeats what section 4 checks with pipelm itself: the full tier only
if full_tier; then
    job=$(submit stub -n 2 --oversubscribe --export=ALL,PIPELM="$WORK/stub/pipelm" "$TOP/jobs/train.sbatch" --steps 60)
    if [ -n "$job" ] && preempt stub "$job" 90; then
        check_resumed stub "$job" 60
    fi
else full_only "preemption of the stand-in pipelm"; fi

# ---- 4. preemption of the real pipelm --------------------------------------------------------------
STEPS=150
job=$(submit preempt -n 2 --oversubscribe --export=ALL,PIPELM="$PIPELM" "$TOP/jobs/train.sbatch" \
    --preset tiny --steps $STEPS --batch 8 --seq-len 32 --ckpt-every 50 --log-every 25 --progress 0)
if [ -n "$job" ] && preempt preempt "$job" 200; then
    check_resumed preempt "$job" $STEPS
    run=$WORK/runs/preempt-$job
    saved=$(last_step "$run/metrics.jsonl")
    [ -n "$saved" ] && [ -f "$run/ckpt/$(printf 'ckpt_%08d.h5' "$saved")" ] &&
        ok "preempt: checkpoint of step $saved saved on the stop" ||
        bad "preempt: checkpoint of the stop step '$saved'" "$(ls "$run/ckpt" 2>&1 | tr '\n' ' ')"
fi

# ---- 5. a small bench sweep ---------------------------------------------------------------------
# the full tier only: section 1 checks jobs/bench.sbatch by its dry run
if full_tier; then
    job=$(PIPELM_STAGES="1 2" PIPELM_MICROBATCHES=2 PIPELM_BENCH_STEPS=2 PIPELM_BENCH_WARMUP=1 \
        submit bench -n 2 --oversubscribe --export=ALL,PIPELM="$PIPELM" "$TOP/jobs/bench.sbatch" \
        --preset tiny --batch 4 --seq-len 32)
    if [ -n "$job" ] && wait_job "$job" 120 "bench sweep"; then
        csv=$WORK/runs/bench-$job/bench.csv
        head=$(head -n 1 "$csv" 2> /dev/null)
        rows=$(tail -n +2 "$csv" 2> /dev/null | grep -cE '^(1f1b|gpipe),[12],2,[0-9.]+,[0-9.]+,[0-9.]+,[0-9.]+,[0-9.]+$')
        if [ "$head" = "schedule,stages,microbatches,tokens_per_s,step_ms_median,mfu,bubble_measured,bubble_theoretical" ] &&
            [ "$rows" -eq 4 ] && [ "$(field "$job" ExitCode)" = 0:0 ]; then
            ok "bench sweep: 4 points in one CSV"
        else
            bad "bench sweep" "$rows rows; $(cat "$csv" 2>&1); $(tail -n 5 bench.out)"
        fi
    fi
else
    full_only "bench sweep under Slurm"
fi
finish
