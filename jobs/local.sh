#!/bin/bash
# jobs/local.sh — the runs of jobs/train.sbatch and jobs/bench.sbatch on a workstation without
# Slurm, with mpiexec.
#
#   jobs/local.sh train -n 4 --preset tiny --steps 50
#   jobs/local.sh bench -n 4 --preset tiny --batch 16
#   PIPELM_RUN_DIR=runs/local-20250101-120000 jobs/local.sh train -n 4 ...   # resume that run
#   PIPELM_DRY_RUN=1 jobs/local.sh train -n 4 ...                            # print, run nothing
#
# -n P is the rank count (pipeline stages x replicas for train, D x P with --dp D; the largest
# rank count of a point for bench); everything after it goes to pipelm. Run directory:
# RUN = ${PIPELM_RUN_DIR:-${PIPELM_RUNS:-./runs}/local-<command>-<date>-<time>}.
#   train: --ckpt-dir RUN/ckpt --metrics RUN/metrics.jsonl, and --resume when RUN/ckpt/latest
#          exists (as train.sbatch); --dp D when PIPELM_DP=D and the arguments give neither
#          --dp nor --stages. Exit status 75 = stopped with a checkpoint saved.
#   bench: the sweep of bench.sbatch (same PIPELM_SCHEDULES, PIPELM_MICROBATCHES, PIPELM_STAGES,
#          PIPELM_DP, PIPELM_BENCH_WARMUP, PIPELM_BENCH_STEPS, PIPELM_BENCH_PEAK) into
#          RUN/bench.csv (a last column dp when PIPELM_DP names a D other than 1).
# Signals: SIGINT, SIGTERM and SIGUSR1 are forwarded to mpiexec, which passes them to every
# rank (pipelm saves a checkpoint and exits 75 on SIGTERM/SIGUSR1). mpiexec runs in its own
# session, so one Ctrl-C reaches it once, through this script.
# Environment: PIPELM (binary; else `pipelm` on PATH, else ./build/pipelm next to jobs/),
# MPIEXEC (default mpiexec), OMP_NUM_THREADS (threads per rank, default 1).
set -euo pipefail

me=local.sh
dry=${PIPELM_DRY_RUN:-0}
say() { echo "$me: $*"; }
die() {
    echo "$me: error: $*" >&2
    exit 1
}
usage() {
    echo "usage: $0 train|bench -n P [pipelm options...]" >&2
    exit 2
}
# show CMD...: print a command, shell-quoted, on the script's own stdout (fd 3) even while a
# run's output goes to a log file
exec 3>&1
show() {
    {
        printf '+'
        printf ' %q' "$@"
        printf '\n'
    } >&3
}

[ $# -ge 1 ] || usage
what=$1
shift
case $what in train | bench) ;; -h | --help) usage ;; *) die "unknown command '$what' (train or bench)" ;; esac
np=1
if [ "${1:-}" = -n ] || [ "${1:-}" = --np ]; then
    [ $# -ge 2 ] || usage
    np=$2
    shift 2
fi
[[ $np =~ ^[1-9][0-9]*$ ]] || die "-n needs a positive rank count (got '$np')"

here=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "${PIPELM:-}" ]; then
    bin=$PIPELM
elif command -v pipelm > /dev/null 2>&1; then
    bin=$(command -v pipelm)
else
    bin=$here/build/pipelm
fi
if [ ! -x "$bin" ]; then
    [ "$dry" = 1 ] || die "no pipelm binary: tried \$PIPELM, pipelm on PATH, $bin"
    say "warning: $bin is not executable (dry run goes on)"
fi
mpiexec=${MPIEXEC:-mpiexec}
command -v "$mpiexec" > /dev/null 2>&1 || [ "$dry" = 1 ] || die "$mpiexec not found (set MPIEXEC)"

# Threads per rank; OpenBLAS would otherwise start one thread per core in every rank.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}

run_dir=${PIPELM_RUN_DIR:-${PIPELM_RUNS:-$PWD/runs}/local-$what-$(date +%Y%m%d-%H%M%S)}

# ---- mpiexec in the background, with signals forwarded ------------------------------------
mpi_pid=""
stop_sig=""
forward() {
    stop_sig=$1
    say "got SIG$1: passing it to mpiexec"
    [ -z "$mpi_pid" ] || kill -s "$1" "$mpi_pid" 2> /dev/null || true
}
trap 'forward INT' INT
trap 'forward TERM' TERM
trap 'forward USR1' USR1

# launch NP ARGS...: pipelm on NP ranks; returns its exit status. The status of a run that a
# signal stopped is still the ranks' own (75 after a checkpoint).
launch() {
    local n=$1 rc
    shift
    local cmd=("$mpiexec" -n "$n" "$bin" "$@")
    show "${cmd[@]}"
    [ "$dry" = 1 ] && return 0
    [ -z "$stop_sig" ] || return 130 # stopped before this run began
    # its own session: a terminal's Ctrl-C reaches mpiexec only through forward()
    setsid "${cmd[@]}" &
    mpi_pid=$!
    while :; do
        rc=0
        wait "$mpi_pid" || rc=$?
        kill -0 "$mpi_pid" 2> /dev/null || break
    done
    mpi_pid=""
    return $rc
}

# ---- train --------------------------------------------------------------------------------
if [ "$what" = train ]; then
    args=("$@")
    has_opt() {
        local a
        for a in ${args[@]+"${args[@]}"}; do
            [ "$a" = "--$1" ] || [ "${a%%=*}" = "--$1" ] && return 0
        done
        return 1
    }
    ckpt_dir=$run_dir/ckpt
    ckpt=1
    # (the help is read whole first: with pipefail, `grep -q` ending the pipe early would fail it)
    if [ -x "$bin" ] && ! grep -q -- --ckpt-dir <<< "$("$bin" train --help 2>&1 || true)"; then
        ckpt=0
        say "warning: $bin has no --ckpt-dir: training without checkpoints"
    fi
    if [ $ckpt = 1 ] && has_opt ckpt-dir; then
        for ((i = 0; i < ${#args[@]}; i++)); do
            case ${args[i]} in
            --ckpt-dir) ckpt_dir=${args[i + 1]:-} ;;
            --ckpt-dir=*) ckpt_dir=${args[i]#*=} ;;
            esac
        done
    elif [ $ckpt = 1 ]; then
        args+=(--ckpt-dir "$ckpt_dir")
    fi
    if ! has_opt metrics; then
        # one metrics file per start, as train.sbatch: metrics.jsonl, metrics.restart<n>.jsonl
        metrics=$run_dir/metrics.jsonl
        n=1
        while [ -e "$metrics" ]; do
            metrics=$run_dir/metrics.restart$n.jsonl
            n=$((n + 1))
        done
        args+=(--metrics "$metrics")
    fi
    # data-parallel replicas from the environment, as train.sbatch does
    if ! has_opt dp && ! has_opt stages && [ -n "${PIPELM_DP:-}" ] && [ "$PIPELM_DP" != 1 ]; then
        args+=(--dp "$PIPELM_DP")
    fi
    # a bare --resume takes an optional FILE: last
    if [ $ckpt = 1 ] && ! has_opt resume && [ -s "$ckpt_dir/latest" ]; then
        args+=(--resume)
        say "checkpoint found ($ckpt_dir/latest): resuming"
    fi
    say "run directory $run_dir ($np ranks, $OMP_NUM_THREADS thread(s) each)"
    show mkdir -p "$run_dir"
    [ "$dry" = 1 ] || mkdir -p "$run_dir"
    rc=0
    launch "$np" train ${args[@]+"${args[@]}"} || rc=$?
    [ "$dry" = 1 ] && exit 0
    if [ "$stop_sig" = INT ] && [ $rc != 0 ] && [ $rc != 75 ]; then
        say "interrupted (SIGINT, exit $rc); run directory $run_dir"
        exit 130
    fi
    case $rc in
    0) say "finished; run directory $run_dir" ;;
    75) say "stopped with a checkpoint saved (exit 75); resume with:
   $(printf ' %q' "PIPELM_RUN_DIR=$run_dir" "$0" train -n "$np" "$@")" ;;
    *) say "pipelm failed (exit $rc); run directory $run_dir" ;;
    esac
    exit $rc
fi

# ---- bench: the sweep of bench.sbatch, with mpiexec ----------------------------------------
json_num() {
    awk -v key="$2" -v obj="${3:-}" '
        { text = text $0 }
        END {
            gsub(/[ \t]/, "", text)
            if (obj != "") {
                if (!match(text, "\"" obj "\":[{][^}]*[}]")) exit
                text = substr(text, RSTART, RLENGTH)
            }
            if (match(text, "\"" key "\":-?[0-9.]+([eE][-+]?[0-9]+)?")) {
                s = substr(text, RSTART, RLENGTH); sub(/^"[^"]*":/, "", s); print s
            }
        }' "$1"
}
schedules=${PIPELM_SCHEDULES:-1f1b gpipe}
mbs=${PIPELM_MICROBATCHES:-1 2 4 8}
if [ -n "${PIPELM_STAGES:-}" ]; then
    stages=$PIPELM_STAGES
else
    stages=""
    for ((p = 1; p < np; p *= 2)); do stages="$stages $p"; done
    stages="$stages $np"
fi
dps=${PIPELM_DP:-1}
dp_col=0
for d in $dps; do
    [[ $d =~ ^[1-9][0-9]*$ ]] || die "PIPELM_DP needs positive replica counts (got '$d')"
    [ "$d" = 1 ] || dp_col=1
done
if [ $dp_col = 1 ] && [ -x "$bin" ] && ! grep -q -- '--dp ' <<< "$("$bin" bench --help 2>&1 || true)"; then
    [ "$dry" = 1 ] || die "PIPELM_DP='$dps' but $bin bench has no --dp (data parallelism)"
    say "warning: $bin bench has no --dp (dry run goes on)"
fi
warmup=${PIPELM_BENCH_WARMUP:-2}
steps=${PIPELM_BENCH_STEPS:-5}
csv=$run_dir/bench.csv
say "sweep: schedules [$schedules] x micro-batches [$mbs] x stages [${stages# }] x replicas [$dps]; results in $run_dir"
show mkdir -p "$run_dir/json" "$run_dir/log"
[ "$dry" = 1 ] || mkdir -p "$run_dir/json" "$run_dir/log"
peak_args=()
if [ "${PIPELM_BENCH_PEAK:-1}" = 1 ]; then
    if [ "$dry" = 1 ]; then
        launch 1 bench --peak --json "$run_dir/peak.json"
        peak_args=(--peak-gflops PEAK_GFLOPS_1)
    elif launch 1 bench --peak --json "$run_dir/peak.json" > "$run_dir/log/peak.out" 2>&1 &&
        [[ " $* " != *" --peak-gflops"* ]]; then
        g1=$(json_num "$run_dir/peak.json" peak_gflops_1)
        [ -z "$g1" ] || peak_args=(--peak-gflops "$g1")
    fi
fi
header="schedule,stages,microbatches,tokens_per_s,step_ms_median,mfu,bubble_measured,bubble_theoretical"
[ $dp_col = 0 ] || header="$header,dp"
[ "$dry" = 1 ] || echo "$header" > "$csv"
n_ok=0
failed=()
# the (stages, replicas) points, "P:D", in sweep order; a point runs on P x D ranks
points=""
for p in $stages; do
    for d in $dps; do points="$points $p:$d"; done
done
for pd in $points; do
    p=${pd%:*} d=${pd#*:}
    n=$((p * d))
    if [ "$n" -gt "$np" ]; then
        say "skipping $p stages x $d replica(s): $n ranks, -n $np"
        continue
    fi
    dp_args=()
    [ "$d" = 1 ] || dp_args=(--dp "$d")
    for s in $schedules; do
        for m in $mbs; do
            [ -z "$stop_sig" ] || break 3
            tag=$s-p$p-m$m
            [ "$d" = 1 ] || tag=$s-p$p-d$d-m$m
            json=$run_dir/json/$tag.json
            if [ "$dry" = 1 ]; then
                launch "$n" bench "$@" ${peak_args[@]+"${peak_args[@]}"} ${dp_args[@]+"${dp_args[@]}"} \
                    --schedule "$s" --microbatches "$m" --warmup "$warmup" --steps "$steps" --json "$json"
                continue
            fi
            rm -f "$json"
            if launch "$n" bench "$@" ${peak_args[@]+"${peak_args[@]}"} ${dp_args[@]+"${dp_args[@]}"} \
                --schedule "$s" --microbatches "$m" --warmup "$warmup" --steps "$steps" --json "$json" \
                > "$run_dir/log/$tag.out" 2>&1 && [ -s "$json" ]; then
                row="$s,$p,$m"
                for k in tokens_per_s "median step_ms" mfu bubble_measured bubble_theoretical; do
                    # shellcheck disable=SC2086 # "median step_ms" is KEY OBJECT on purpose
                    row="$row,$(json_num "$json" $k)"
                done
                [ $dp_col = 0 ] || row="$row,$d"
                echo "$row" >> "$csv"
                n_ok=$((n_ok + 1))
                say "$tag: $(json_num "$json" tokens_per_s) tokens/s"
            else
                failed+=("$tag")
                say "$tag FAILED; last lines of $run_dir/log/$tag.out:"
                tail -n 5 "$run_dir/log/$tag.out" | sed 's/^/    /'
            fi
        done
    done
done
[ "$dry" = 1 ] && { say "then: gather every JSON into $csv"; exit 0; }
[ -z "$stop_sig" ] || say "stopped by SIG$stop_sig"
say "$n_ok point(s) in $csv"
if [ ${#failed[@]} -gt 0 ] || [ -n "$stop_sig" ]; then
    [ ${#failed[@]} -eq 0 ] || say "${#failed[@]} point(s) failed: ${failed[*]}"
    exit 1
fi
