#!/bin/bash
# test_gpu_check.sh — bench/gpu_check.sh's logic without a GPU: its dry run on the CPU backend
# (GPU_CHECK_DRYRUN=1 GPU_CHECK_FAKE=1, with this build through GPU_CHECK_BUILD) walks the
# batch list largest first: a batch the stage's size limit refuses and one that runs out of
# memory (injected) are "does not fit", the next fits; results.json is rewritten after every
# result, so a run killed with SIGKILL keeps what it measured and every version of the file
# parses; a budget too small for a required step stops the run with the step named.
# Full tier only (about a minute): the whole dry run (every step, status ok), and a budget that
# runs out while a step runs (its timeout capped by the time left: the run ends on time).
. "$(dirname "$0")/../lib/lib.sh"
TOP=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
BUILD=$(cd "$(dirname "$PIPELM")" && pwd)
cd "$WORK" || exit 1
export PATH=$(dirname "$(command -v "$MPIEXEC")"):$PATH # the script runs plain mpiexec
export GPU_CHECK_DRYRUN=1 GPU_CHECK_FAKE=1 GPU_CHECK_BUILD=$BUILD

# gc NAME [VAR=VALUE...]: the dry run with its OUT in NAME/, its output in NAME.log; sets RC
gc() {
    local name=$1
    shift
    mkdir -p "$name"
    RC=0
    env OUT="$WORK/$name" TMPDIR="$WORK" "$@" bash "$TOP/bench/gpu_check.sh" >"$name.log" 2>&1 || RC=$?
}
# field DIR KEY: KEY of DIR/results.json ("PARSE ERROR" if it does not parse)
field() {
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], "(absent)"))' \
        "$1/results.json" "$2" 2>/dev/null || echo "PARSE ERROR"
}
# has NAME DIR KEY PATTERN: KEY of DIR/results.json matches the grep pattern
has() {
    local v
    v=$(field "$2" "$3")
    if printf '%s\n' "$v" | grep -q -- "$4"; then ok "$1"; else bad "$1" "$3 = '$v', want /$4/"; fi
}

# ---- the batch search, then SIGKILL; results.json watched while it runs
mkdir -p kill snaps
(gc kill GPU_CHECK_STEPS=5 GPU_CHECK_KILL_AFTER=gpt2_batch; exit "$RC") &
pid=$!
n=0
while kill -0 "$pid" 2>/dev/null; do
    if [ -f kill/results.json ] && ! cmp -s kill/results.json "snaps/$n.json"; then
        n=$((n + 1))
        cp kill/results.json "snaps/$n.json" 2>/dev/null
    fi
    sleep 0.05
done
RC=0
wait "$pid" || RC=$?
[ "$RC" = 137 ] && ok "killed run: exit 137 (SIGKILL)" || bad "killed run" "exit $RC, want 137"
has "B=262144: refused by the size limit, does not fit" kill gpt2_B262144 "does not fit: refused by the size limit"
has "B=32: out of memory (injected), does not fit" kill gpt2_B32 "does not fit: out of memory"
has "B=16 fits and is chosen" kill gpt2_batch "^16$"
has "killed: status says incomplete" kill status "^incomplete"
has "killed: nothing after the kill" kill gpt2_step1_loss "(absent)"
bad_snaps=0
for f in snaps/*.json; do python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$f" 2>/dev/null || bad_snaps=$((bad_snaps + 1)); done
if [ "$n" -ge 3 ] && [ "$bad_snaps" = 0 ]; then ok "results.json rewritten during the run ($n versions seen, all parse)"
else bad "results.json during the run" "$n versions seen, $bad_snaps do not parse"; fi
[ -s kill/summary.txt ] && ok "killed run: summary.txt kept" || bad "killed run" "no summary.txt"

# ---- a budget that leaves no time for a required step
gc nobudget GPU_CHECK_STEPS=5 GPU_CHECK_BUDGET=10 GPU_CHECK_RESERVE=8
[ "$RC" -ne 0 ] && ok "no time: exits non-zero" || bad "no time" "exit 0"
has "no time: the step named" nobudget failed_step "out of time before"
has "no time: status FAILED" nobudget status "^FAILED"

# ---- full tier: the whole dry run, and a budget that runs out during a step
if full_tier; then
    gc all
    [ "$RC" = 0 ] && ok "whole dry run: exit 0" || bad "whole dry run" "exit $RC: $(tail -n 5 all.log)"
    has "whole dry run: status ok" all status "^ok$"
    for k in identical_run-to-run identical_1-vs-2-ranks identical_1-vs-4-ranks identical_bf16-1-vs-2-ranks; do
        has "whole dry run: $k" all "$k" "^yes$"
    done
    has "whole dry run: injected failure" all injected_failure_one_rank "ends both ranks"
    has "whole dry run: step-1 loss near ln V" all gpt2_step1_loss "tol 0.5: ok"
    has "whole dry run: pipeline runs" all pipeline_p2 "ran (6 steps)"
    [ -s all/details.tar.gz ] && ok "whole dry run: details.tar.gz" || bad "whole dry run" "no details.tar.gz"
    # B=4096 of the tiny model takes about a minute: the 30 s budget must cut it
    t0=$(date +%s)
    gc short GPU_CHECK_STEPS=5 GPU_CHECK_BATCH=4096 GPU_CHECK_BUDGET=30 GPU_CHECK_RESERVE=2
    wall=$(($(date +%s) - t0))
    if [ "$RC" -ne 0 ] && [ "$wall" -le 32 ]; then ok "short budget: stops in ${wall}s (budget 30)"
    else bad "short budget" "exit $RC after ${wall}s (budget 30)"; fi
    has "short budget: the cut step named" short failed_step "B=4096: timed out\|out of time"
else
    full_only "the whole dry run; a budget that runs out during a step"
fi
finish
