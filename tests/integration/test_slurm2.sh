#!/bin/bash
# test_slurm2.sh — jobs/train.sbatch across two Slurm nodes on one machine: two slurmds, each in
# a network namespace of its own, joined by veth pairs on a bridge that also holds slurmctld's
# address (tests/lib/slurm_cluster.sh start --nodes 2). The job is D x P = 2 x 2
# on 2 nodes x 2 tasks: ranks 0-1 (the two replicas of stage 0) on node1, ranks 2-3 (stage 1)
# on node2, so the pipeline's traffic crosses the nodes. Checked:
#   1. a straight job completes, with its ranks placed as above, and its losses equal (as
#      printed, every step) those of the same run with mpiexec on this machine;
#   2. MPI traffic between the nodes crossed the veths: their byte counters grew by at least
#      what the pipeline must send each way (see cross_check);
#   3. preemption across the nodes: SIGUSR1 to the batch shell, every rank on both nodes saves a
#      checkpoint, exit 75, requeue, resume on both nodes, finish, and the losses of the two
#      starts together equal the straight run's;
#   4. a jobs/bench.sbatch sweep over D = 1 2 on the two nodes, into one CSV;
#   6. a node lost mid-run: a --dp auto --stages auto job on both nodes (submitted -N 1-2
#      --no-kill), node2's slurmd and ranks killed after the first checkpoint; Slurm keeps
#      the job on node1, train.sbatch starts pipelm again there (2 ranks, the layout pipelm
#      picks) from the newest checkpoint, it finishes, and its losses are within 1e-5 of the
#      straight run's (4 ranks locally);
#   5. the cluster's teardown leaves no namespace, veth, bridge, daemon or job process behind.
# And, not a check, a control: a short job of the same shape without UCX_TLS, whose counters
# show that UCX then takes shared memory between the namespaces.
# Skipped (77) only where the machine lacks a part: the Slurm or munge packages, root, or the
# right to make network namespaces. The cluster starts and stops inside the test, under a trap
# that stops it on every exit; every wait is bounded, and all of them end at a deadline
# (DEADLINE_S, default 360 s).
. "$(dirname "$0")/../lib/lib.sh"
# two nodes, their namespaces and a requeue take about 40 s: the full tier only (test_slurm.sh
# keeps a job, its preemption and requeue on one node in the plain tier)
if ! full_tier; then full_only "two Slurm nodes in network namespaces"; finish; exit; fi
TOP=${TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
[ -x "$PIPELM" ] || PIPELM=$TOP/build/pipelm
for c in sbatch squeue scontrol scancel sinfo slurmctld slurmd munged mungekey ip nsenter unshare; do
    if ! command -v $c > /dev/null; then
        echo "SKIP: $c not found (apt-get install slurm-wlm munge slurmctld slurmd slurm-client iproute2)"
        exit 77
    fi
done
if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: private slurmds in network namespaces need root"
    exit 77
fi
# a container may forbid namespaces: that is a missing machine part, not a failure
probe=pipelm-probe-$$
if ! ip netns add "$probe" 2> /dev/null; then
    echo "SKIP: ip netns add is not permitted here"
    exit 77
fi
ip netns del "$probe"
[ -x "$PIPELM" ] || { echo "FAIL: no pipelm binary at $PIPELM"; exit 1; }
cd "$WORK" || exit 1
T_END=$(($(date +%s) + ${DEADLINE_S:-360}))

. "$TOP/tests/lib/slurm_lib.sh"

# ---- the run: D x P, shape, and the bytes the pipeline must move --------------------------------
# tiny preset (C = 64, given explicitly: the byte bound below uses it), a small batch
B=8 T=32 C=64 M=2 STEPS=40
D=2 P=2
FLAGS=(--preset tiny --n-embd "$C" --batch "$B" --seq-len "$T" --microbatches "$M" --steps "$STEPS"
    --log-every 10 --progress 0 --eval-every 0)
FLAGS=(--dp "$D" "${FLAGS[@]}")
# With rank r on stage r / D and 2 ranks per node, stages 0..P/2-1 are on node1 and the rest on
# node2: one stage boundary lies between the nodes. Every step sends across it the activations
# of the whole batch forward (B x T x C floats, whichever replica carries which sequences) and
# their gradients backward (the same size): at least B*T*C*4 bytes each way per step, before
# any header, the tied-embedding all-reduce or the checkpoint traffic.
BOUND=$((B * T * C * 4 * STEPS))

# The reference: the same run on this machine, one mpiexec, shared memory.
if ! mpirun_t "$(left 120)" 4 train "${FLAGS[@]}" --metrics "$WORK/ref.jsonl" > ref.out 2>&1 ||
    [ "$(losses ref.jsonl | wc -l)" -ne $STEPS ]; then
    bad "one-node reference run (mpiexec -n 4)" "$(tail -n 5 ref.out)"
    finish
    exit
fi
ok "one-node reference: mpiexec -n 4, D x P = $D x $P, $STEPS steps"

# ---- the cluster ----------------------------------------------------------------------------------
# a lost node (section 6) is declared down after SlurmdTimeout: 15 s here, not Slurm's 300
if ! env_out=$(SLURM_CLUSTER_SLURMD_TIMEOUT=15 timeout 60 "$TOP/tests/lib/slurm_cluster.sh" start --nodes 2 2> cluster.err); then
    bad "start the two-node Slurm cluster" "$(tail -n 15 cluster.err)"
    finish
    exit
fi
eval "$env_out"
CLUSTER=$SLURM_CLUSTER_DIR
read -r LINK1 LINK2 <<< "$SLURM_CLUSTER_LINKS"
BRIDGE=$(sed -n 's/^bridge //p' "$CLUSTER/net")
NETNS=$(sed -n 's/^netns //p' "$CLUSTER/net" | tr '\n' ' ')
ok "two-node cluster up: $(sinfo -h -N -o '%N@%o %T' | tr '\n' ' ')(bridge $BRIDGE)"

# MPI between the nodes: MPICH's ch4:ucx takes UCX's choice, and UCX decides two processes share
# a host by the kernel's boot id, which both namespaces have; it would then use shared memory
# (/dev/shm is common to them) and nothing would cross the veths. UCX_TLS=tcp,self makes
# UCX use TCP for every peer MPICH does not reach through its own shared memory, which is
# only the ranks MPICH knows are on the same node (Slurm's PMI says which).
export UCX_TLS=tcp,self
# Debian 12's MPICH 4.0.2 ends MPI_Finalize with ucp_disconnect_nb on every peer, then a PMI
# barrier that stops progressing UCX; a TCP endpoint that has sent data flushes with a zero-byte
# put that waits for the peer's ack, which a peer already in the barrier never sends: every
# rank hangs in MPI_Finalize, after the run is over (fixed in MPICH 4.2, pmodels/mpich#6596).
# Where MPICH is older than 4.2, this preload makes the disconnect return at once; the
# endpoints go when the UCX worker is destroyed. It touches nothing before MPI_Finalize, and
# only the jobs get it.
JOBENV=ALL,PIPELM=$PIPELM
if ! mpichversion 2> /dev/null | grep -qE 'Version:[[:space:]]+(4\.([2-9]|[1-9][0-9])|[5-9]|[1-9][0-9])'; then
    printf 'void *ucp_disconnect_nb(void *ep) { (void)ep; return 0; }\n' > ucx_close.c
    if ${CC:-cc} -shared -fPIC -O2 -o ucx_close.so ucx_close.c 2> cc.err; then
        JOBENV=$JOBENV,LD_PRELOAD=$WORK/ucx_close.so
    else
        bad "build the MPI_Finalize work-around" "$(cat cc.err)"
    fi
fi

# bytes LINK: what crossed LINK, the root-namespace end of a node's veth: rx = sent by the node
bytes() { cat "/sys/class/net/$1/statistics/rx_bytes"; }
# counters: node1's sent bytes, node2's, and what the root namespace received from both (the
# bridge device counts only frames for slurmctld and the clients, none passed port to port),
# with its packet count (14-byte Ethernet headers the bridge leaves out of its byte count)
counters() {
    echo "$(bytes "$LINK1") $(bytes "$LINK2") $(bytes "$BRIDGE") $(cat "/sys/class/net/$BRIDGE/statistics/rx_packets")"
}
# cross_check NAME "BEFORE" "AFTER": each node sent the other at least BOUND bytes. A node's
# veth counts all it sent: to the other node and to the root namespace (Slurm's own messages);
# the second part is at most what the bridge device received, so what a node sent minus that
# is a lower bound on the bytes that went node to node through the veths and the bridge.
cross_check() {
    local name=$1 l1a l2a bra bpa l1b l2b brb bpb
    read -r l1a l2a bra bpa <<< "$2"
    read -r l1b l2b brb bpb <<< "$3"
    local root=$((brb - bra + 14 * (bpb - bpa)))
    local n12=$((l1b - l1a - root)) n21=$((l2b - l2a - root))
    echo "     $name: node1 sent $((l1b - l1a)) B, node2 sent $((l2b - l2a)) B, the root namespace got $root B:"
    echo "     node1 -> node2 >= $n12 B, node2 -> node1 >= $n21 B; the pipeline needs >= $BOUND B each way"
    if [ "$n12" -ge $BOUND ] && [ "$n21" -ge $BOUND ]; then
        ok "$name: MPI traffic crossed the network (>= $BOUND B each way through the veths)"
    else
        bad "$name: too few bytes between the nodes for the pipeline" \
            "$n12 and $n21 B, want >= $BOUND each way: MPI did not use the network (shared memory?)"
    fi
}
# placement_check NAME LOG: Slurm's layout line and pipelm's own view of it in the job log
placement_check() {
    local name=$1 log=$2 want got
    want="node1: ranks 0-1 = stage 0; node2: ranks 2-3 = stage 1"
    grep -qF "layout (block distribution): $want" "$log" &&
        ok "$name: train.sbatch placed the ranks: $want" ||
        bad "$name: layout line" "$(grep 'layout' "$log")"
    # MPI itself sees two nodes: pipelm counts the ranks that share its node (rank 0's line)
    grep -q "^layout: 2 ranks on this node" "$log" &&
        ok "$name: MPI sees 2 ranks per node, not 4" ||
        bad "$name: ranks per node" "$(grep '^layout:' "$log")"
    # rank 0 prints each (stage, replica)'s rank and host: stage 0 on node1, 1 on node2
    got=$(awk '/stage +replica +rank +host/ {t = 1; next}
               t && NF == 4 && $1 ~ /^[0-9]+$/ {printf "%s/%s/%s/%s ", $1, $2, $3, $4; next}
               t {t = 0}' "$log" | head -c 200)
    [ "$got" = "0/0/0/node1 0/1/1/node1 1/0/2/node2 1/1/3/node2 " ] &&
        ok "$name: pipelm's table: both replicas of stage 0 on node1, of stage 1 on node2" ||
        bad "$name: pipelm's (stage, replica) -> host table" "'$got'"
}
# job_losses JOB NAME: the step losses of every start of the job, in order
job_losses() {
    local run=$WORK/runs/$2-$1 f
    for f in "$run/metrics.jsonl" "$run"/metrics.restart*.jsonl; do [ -f "$f" ] && losses "$f"; done
}

# ---- 1, 2. a straight two-node job ------------------------------------------------------------------
before=$(counters)
job=$(submit two -N 2 --ntasks-per-node=2 --export="$JOBENV" "$TOP/jobs/train.sbatch" "${FLAGS[@]}")
if [ -z "$job" ]; then
    bad "sbatch -N 2 train.sbatch" "no job id"
elif wait_job "$job" 120 "two-node job"; then
    after=$(counters)
    state="$(field "$job" JobState) $(field "$job" ExitCode)"
    [ "$state" = "COMPLETED 0:0" ] && ok "two-node job $job completed on $(field "$job" NodeList)" ||
        bad "two-node job state" "$state; $(tail -n 8 two.out)"
    placement_check "two-node job" two.out
    if [ "$(job_losses "$job" two)" = "$(losses ref.jsonl)" ]; then
        ok "two-node job: all $STEPS losses equal the one-node run's, as printed"
    else
        bad "two-node job losses" "$(diff <(job_losses "$job" two) <(losses ref.jsonl) | head -n 6 | tr '\n' ' ')"
    fi
    cross_check "two-node job" "$before" "$after"
fi

# ---- 3. preemption, requeue and resume across the two nodes ----------------------------------
before=$(counters)
job=$(submit preempt -N 2 --ntasks-per-node=2 --export="$JOBENV" "$TOP/jobs/train.sbatch" \
    "${FLAGS[@]}" --ckpt-every 0)
run=$WORK/runs/preempt-$job
if [ -z "$job" ]; then
    bad "sbatch the preemption job" "no job id"
elif ! wait_until 60 eval "running $job && has_step $run/metrics.jsonl"; then
    bad "preempt: job $job never ran a step" "$(squeue -h -j "$job" -o '%T %r'); $(tail -n 5 preempt.out 2>&1)"
    timeout 10 scancel "$job" 2> /dev/null
else
    timeout 10 scancel --signal=USR1 --batch "$job"
    if wait_job "$job" 150 "preempt: the preempted job"; then
        after=$(counters)
        state="$(field "$job" JobState) $(field "$job" ExitCode)"
        restarts=$(field "$job" Restarts)
        [ "$state" = "COMPLETED 0:0" ] && [ "$restarts" = 1 ] &&
            ok "preempt: job $job completed after 1 requeue" || bad "preempt: job state" "$state, Restarts=$restarts"
        grep -q "got SIGUSR1" preempt.out && grep -q "(exit 75): requeueing job $job" preempt.out &&
            ok "preempt: SIGUSR1 forwarded to both nodes' ranks, exit 75, requeued" ||
            bad "preempt: log" "$(grep 'train.sbatch' preempt.out)"
        saved=$(last_step "$run/metrics.jsonl")
        first=$(first_step "$run/metrics.restart1.jsonl" 2> /dev/null)
        if [ -n "$saved" ] && [ "$saved" -lt $STEPS ] && [ "$first" = $((saved + 1)) ] &&
            [ -f "$run/ckpt/$(printf 'ckpt_%08d.h5' "$saved")" ] && grep -q "^+ srun .* --resume$" preempt.out; then
            ok "preempt: checkpoint of step $saved saved on the stop; the requeued job resumed at step $first"
        else
            bad "preempt: resume point" "stopped at '$saved', resumed at '$first'; $(ls "$run/ckpt" 2>&1 | tr '\n' ' ')"
        fi
        [ "$(end_steps "$run/metrics.restart1.jsonl" 2> /dev/null)" = $STEPS ] &&
            ok "preempt: all $STEPS steps done" || bad "preempt: final step" "$(tail -n 2 "$run/metrics.restart1.jsonl" 2>&1)"
        # both starts ran on both nodes, placed as before
        n=$(grep -c "layout (block distribution): node1: ranks 0-1 .*; node2: ranks 2-3" preempt.out)
        [ "$n" = 2 ] && ok "preempt: both starts ran on node1 and node2" || bad "preempt: starts on two nodes" "$n layout lines"
        if [ "$(job_losses "$job" preempt)" = "$(losses ref.jsonl)" ]; then
            ok "preempt: the losses of both starts together equal the straight run's"
        else
            bad "preempt: losses" "$(diff <(job_losses "$job" preempt) <(losses ref.jsonl) | head -n 6 | tr '\n' ' ')"
        fi
        cross_check "preempted job (both starts)" "$before" "$after"
    fi
fi

# ---- 4. a bench sweep over D across the two nodes (jobs/bench.sbatch) --------------------------
job=$(PIPELM_STAGES=2 PIPELM_DP="1 2" PIPELM_MICROBATCHES=2 PIPELM_SCHEDULES=1f1b PIPELM_BENCH_PEAK=0 \
    PIPELM_BENCH_STEPS=2 PIPELM_BENCH_WARMUP=1 submit bench -N 2 --ntasks-per-node=2 --export="$JOBENV" \
    "$TOP/jobs/bench.sbatch" --preset tiny --n-embd $C --batch $B --seq-len $T)
if [ -n "$job" ] && wait_job "$job" 60 "bench sweep over D"; then
    csv=$WORK/runs/bench-$job/bench.csv
    head=$(head -n 1 "$csv" 2> /dev/null)
    rows=$(tail -n +2 "$csv" 2> /dev/null | grep -cE '^1f1b,2,2,([0-9.]+,){5}(1|2)$')
    if [ "$head" = "schedule,stages,microbatches,tokens_per_s,step_ms_median,mfu,bubble_measured,bubble_theoretical,dp" ] &&
        [ "$rows" -eq 2 ] && [ "$(field "$job" ExitCode)" = 0:0 ] &&
        grep -q "^layout: 2 ranks on this node" "$WORK/runs/bench-$job/log/1f1b-p2-d2-m2.out"; then
        ok "bench sweep over D: P=2 x D=1 and x D=2 (on both nodes) in one CSV with a dp column"
    else
        bad "bench sweep over D" "$rows rows; $(cat "$csv" 2>&1); $(tail -n 5 bench.out)"
    fi
fi

# ---- the control: the same job with UCX's own choice of transport ---------------------------------
# Not a pass/fail check (it shows UCX's behaviour, not pipelm's): without UCX_TLS, UCX takes the
# two namespaces for one host and uses shared memory, and the counters show it. This is how the
# counters above tell the network from shared memory.
CSTEPS=10
before=$(counters)
job=$(unset UCX_TLS; submit control -N 2 --ntasks-per-node=2 --export="$JOBENV" "$TOP/jobs/train.sbatch" \
    "${FLAGS[@]}" --steps $CSTEPS)
if [ -n "$job" ] && wait_job "$job" 60 "control job"; then
    after=$(counters)
    read -r l1a l2a bra bpa <<< "$before"
    read -r l1b l2b brb bpb <<< "$after"
    root=$((brb - bra + 14 * (bpb - bpa)))
    echo "note - control without UCX_TLS ($(field "$job" JobState)): node1 -> node2 >= $((l1b - l1a - root)) B," \
        "node2 -> node1 >= $((l2b - l2a - root)) B in $CSTEPS steps, where the pipeline moves >= $((BOUND / STEPS * CSTEPS)) B" \
        "each way: UCX used shared memory between the namespaces"
fi

# ---- 6. a node lost mid-run: the job goes on with what is left ----------------------------------
EL=(--preset tiny --n-embd "$C" --batch "$B" --seq-len "$T" --microbatches "$M" --steps 200 --log-every 10
    --progress 0 --eval-every 0 --dp auto --stages auto --ckpt-every 20)
# the straight run: here, over shared memory (no UCX_TLS) and without the checkpoints (they do not
# change the losses), 4 ranks on the machine's cores alongside the cluster
(unset UCX_TLS; timeout -k 5 300 "$MPIEXEC" -n 4 "$PIPELM" train "${EL[@]}" --ckpt-every 0 --metrics el_ref.jsonl) \
    > el_ref.out 2>&1 ||
    bad "elastic: the straight run" "$(tail -n 3 el_ref.out)"
job=$(submit elastic -N 1-2 --ntasks-per-node=2 --no-kill --export="$JOBENV" "$TOP/jobs/train.sbatch" "${EL[@]}")
run=$WORK/runs/elastic-$job
NS2=$(sed -n 's/^netns //p' "$CLUSTER/net" | grep -- '-node2$')
if [ -z "$job" ]; then bad "elastic: sbatch" "no job id"
elif ! wait_until 120 eval "running $job && [ -s $run/ckpt/latest ]"; then
    bad "elastic: job $job never saved a checkpoint on two nodes" "$(tail -n 5 elastic.out)"
    timeout 10 scancel "$job"
else
    saved=$(sed 's/^ckpt_0*\([0-9][0-9]*\)\.h5$/\1/' "$run/ckpt/latest")
    t_kill=$(date +%s)
    # the node dies: its slurmd, its slurmstepd and its ranks, everything in its namespace
    kill -KILL $(ip netns pids "$NS2") 2> /dev/null
    if wait_job "$job" 240 "elastic job after the node loss"; then
        secs=$(($(date +%s) - t_kill))
        state="$(field "$job" JobState) $(field "$job" ExitCode)"
        grep -q "node(s) lost: this job now holds 1 node(s) (node1) of the 2" elastic.out &&
            grep -q "restart 1 on 1 node(s), 2 tasks: resuming from ckpt_" elastic.out && [ "$state" = "COMPLETED 0:0" ] &&
            ok "elastic: node2 lost after the step-$saved checkpoint; job $job went on on node1 with 2 ranks and completed in $secs s" ||
            bad "elastic: restart on node1" "$state; $(grep 'train.sbatch' elastic.out | tail -n 4 | tr '\n' ' ')"
        first=$(first_step "$run/metrics.restart1.jsonl" 2> /dev/null)
        grep '^layout: D x P' elastic.out | tail -n 1 | grep -q 'on 2 ranks' && [ -n "$first" ] && [ "$first" -le $((saved + 1)) ] &&
            [ "$(end_steps "$run/metrics.restart1.jsonl")" = 200 ] &&
            ok "elastic: the restart resumed at step $first ($(grep '^layout: D x P' elastic.out | tail -n 1 | cut -d: -f2 | cut -d'(' -f1)) and ran to step 200" ||
            bad "elastic: resume" "first step '$first' after the step-$saved checkpoint; $(grep '^layout: D x P' elastic.out | tr '\n' ' ')"
        if python3 - el_ref.jsonl "$run/metrics.jsonl" "$run/metrics.restart1.jsonl" > el_cmp.out 2>&1 <<'PY'
import json, sys
def L(f): return {d["step"]: d["loss"] for d in map(json.loads, open(f)) if d.get("event") == "step"}
ref, starts = L(sys.argv[1]), [L(f) for f in sys.argv[2:]]
worst = max(abs(l[s] - ref[s]) / abs(ref[s]) for l in starts for s in l)
assert worst <= 1e-5 and all(s in ref for l in starts for s in l) and max(starts[1]) == max(ref), worst
print("%.2g" % worst)
PY
        then ok "elastic: both starts' losses within $(cat el_cmp.out) (relative) of the straight 4-rank run's (limit 1e-5)"
        else bad "elastic: losses" "$(tail -n 3 el_cmp.out)"; fi
    fi
fi

# ---- 5. teardown leaves nothing -------------------------------------------------------------------
daemons=$(awk '{print $1 ":" $2}' "$CLUSTER/pids" | tr '\n' ' ')
conf=$SLURM_CONF
timeout 90 "$TOP/tests/lib/slurm_cluster.sh" stop "$CLUSTER"
rc=$?
CLUSTER=""
left_over=""
for ns in $NETNS; do ip netns list | awk '{print $1}' | grep -qxF "$ns" && left_over="$left_over netns:$ns"; done
for l in $LINK1 $LINK2 $BRIDGE; do ip link show "$l" > /dev/null 2>&1 && left_over="$left_over link:$l"; done
# a daemon is left if its PID still runs it (an exited one may linger a moment as a zombie,
# with an empty command line, until init reaps it)
for d in $daemons; do
    { tr '\0' ' ' < "/proc/${d#*:}/cmdline"; } 2> /dev/null | grep -q "${d%%:*}" && left_over="$left_over $d"
done
# job processes: anything that still carries the cluster's SLURM_CONF (not this shell's children)
for f in /proc/[0-9]*/environ; do
    p=${f//[^0-9]/}
    [ "$p" = $$ ] || [ "$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2> /dev/null)" = $$ ] && continue
    { tr '\0' '\n' < "$f"; } 2> /dev/null | grep -qxF "SLURM_CONF=$conf" && left_over="$left_over job:$p"
done
[ -e "$(dirname "$conf")" ] && left_over="$left_over dir:$(dirname "$conf")"
[ $rc = 0 ] && [ -z "$left_over" ] &&
    ok "teardown: no namespace, veth, bridge, daemon or job process left" ||
    bad "teardown" "stop exit $rc; left:$left_over"
finish
