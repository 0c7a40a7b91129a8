#!/bin/bash
# slurm_cluster.sh — a private single-node Slurm cluster on localhost, for tests and trials.
#
#   eval "$(tests/slurm_cluster.sh start)"   # sets and exports SLURM_CLUSTER_DIR and SLURM_CONF
#   sbatch ... ; squeue ...                  # clients find the cluster through SLURM_CONF
#   tests/slurm_cluster.sh status "$SLURM_CLUSTER_DIR"
#   tests/slurm_cluster.sh stop "$SLURM_CLUSTER_DIR"
#
# Everything lives in one temp directory: munge key and socket, slurm.conf, state, spool, logs,
# and a file `pids` naming the three daemons started (munged, slurmctld, slurmd -N localhost).
# `stop` cancels the cluster's jobs, ends exactly those daemons (and any job process left
# behind that carries this cluster's SLURM_CONF), then removes the directory.
# Needs root (slurmd starts jobs as their owner) and Debian's slurm-wlm and munge packages.
# Setup facts (no systemd; linuxproc proctrack; pmi2): shared/notes/toolchain.md, last section.
set -u

die() { echo "slurm_cluster: $*" >&2; exit 1; }

# A TCP port on localhost that nothing listens on (a failed connect means free).
free_port() {
    local p tries=0
    while [ $tries -lt 50 ]; do
        p=$((20000 + RANDOM % 30000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo $p; return 0; fi
        tries=$((tries + 1))
    done
    return 1
}

# alive PID NAME: PID is running and is the daemon NAME (guards against a reused PID).
alive() {
    [ -n "$1" ] && { tr '\0' ' ' < "/proc/$1/cmdline"; } 2> /dev/null | grep -q "$2"
}

# Job processes of this cluster left behind: slurmstepd (started by our slurmd, so it carries
# our SLURM_CONF) and the tasks and batch shells under it (SLURM_CONF and a SLURM_JOB_ID).
# This script's own process tree is never listed (its subshells share its environment).
cluster_procs() {
    local conf=$1 f pid env
    for f in /proc/[0-9]*/environ; do
        pid=${f#/proc/}
        pid=${pid%/environ}
        [ "$pid" = $$ ] || [ "$pid" = "$BASHPID" ] && continue
        [ "$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2> /dev/null)" = $$ ] && continue
        env=$({ tr '\0' '\n' < "$f"; } 2> /dev/null) || continue
        grep -qxF "SLURM_CONF=$conf" <<< "$env" || continue
        if grep -q '^SLURM_JOB_ID=' <<< "$env" || alive "$pid" '^slurmstepd'; then echo "$pid"; fi
    done
}

stop_cluster() {
    local dir=$1
    [ -f "$dir/slurm.conf" ] && [ -f "$dir/pids" ] || die "$dir is not a cluster made by this script"
    export SLURM_CONF=$dir/slurm.conf
    # end the jobs first so no slurmstepd outlives its slurmd
    if alive "$(awk '$1 == "slurmctld" {print $2}' "$dir/pids")" slurmctld; then
        scancel --full --quiet --user="$(id -un)" 2>/dev/null
        for _ in $(seq 1 30); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    # daemons in reverse start order: slurmd, slurmctld, munged
    local name pid
    for name in slurmd slurmctld munged; do
        pid=$(awk -v n=$name '$1 == n {print $2}' "$dir/pids")
        [ -n "$pid" ] && alive "$pid" "$name" || continue
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 1 50); do alive "$pid" "$name" || break; sleep 0.2; done
        if alive "$pid" "$name"; then
            echo "slurm_cluster: $name ($pid) ignored SIGTERM: SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null
        fi
    done
    # job processes left behind (a step killed mid-way) carry this cluster's SLURM_CONF
    local left
    left=$(cluster_procs "$dir/slurm.conf")
    if [ -n "$left" ]; then
        echo "slurm_cluster: killing leftover job processes:" "$left" >&2
        # shellcheck disable=SC2086 # one PID per word
        kill -KILL $left 2> /dev/null
    fi
    rm -rf "$dir"
}

start_cluster() {
    local dir=${1:-}
    for cmd in munged mungekey slurmctld slurmd sbatch squeue sinfo scontrol; do
        command -v $cmd > /dev/null || die "$cmd not found (apt-get install slurm-wlm munge)"
    done
    [ "$(id -u)" -eq 0 ] || die "needs root (slurmd runs jobs as their owner)"
    if [ -z "$dir" ]; then
        dir=$(mktemp -d "${TMPDIR:-/tmp}/pipelm_slurm.XXXXXX") || die "mktemp failed"
    else
        mkdir -p "$dir" || die "cannot create $dir"
        dir=$(cd "$dir" && pwd)
    fi
    chmod 0755 "$dir"
    mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log" "$dir/run"
    chmod 0755 "$dir/munge" # munge wants its socket directory world-readable, not writable
    : > "$dir/pids"
    # from here on, a failure stops whatever has started and removes the directory
    trap 'echo "slurm_cluster: start failed; logs:" >&2; tail -n 20 "$dir"/log/* >&2 2>/dev/null;
          stop_cluster "$dir"; exit 1' ERR
    set -E

    # munge: private key and socket
    mungekey --create --keyfile="$dir/munge/munge.key" > /dev/null 2>&1 ||
        dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 0400 "$dir/munge/munge.key"
    local sock=$dir/munge/munge.socket
    setsid munged --foreground --force --socket="$sock" --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/munged.seed" < /dev/null > "$dir/log/munged.out" 2>&1 &
    echo "munged $!" >> "$dir/pids"
    for _ in $(seq 1 50); do [ -S "$sock" ] && break; sleep 0.1; done
    [ -S "$sock" ]

    # the node as slurmd sees it; CPUs and memory must not exceed this
    local hw ctld_port slurmd_port
    hw=$(slurmd -C | head -n 1 | sed 's/^NodeName=[^ ]* //')
    [ -n "$hw" ]
    ctld_port=$(free_port)
    slurmd_port=$(free_port)
    [ "$ctld_port" != "$slurmd_port" ]
    cat > "$dir/slurm.conf" <<EOF
# written by tests/slurm_cluster.sh: one node (localhost), one partition, no accounting
ClusterName=pipelmtest
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$sock,cred_expire=${SLURM_CLUSTER_CRED_EXPIRE:-10}
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/slurmd-%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$dir/plugstack.conf
# no cgroups here (no freezer controller): track processes by parent, bind nothing
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# with MpiDefault=none, srun -n 2 starts two 1-rank MPI jobs
MpiDefault=pmi2
MailProg=/bin/true
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
ReturnToService=2
JobRequeue=1
InactiveLimit=0
KillWait=10
MinJobAge=600
SlurmdTimeout=60
NodeName=localhost NodeAddr=127.0.0.1 $hw State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    : > "$dir/plugstack.conf"
    export SLURM_CONF=$dir/slurm.conf

    setsid slurmctld -D -i < /dev/null > "$dir/log/slurmctld.out" 2>&1 &
    echo "slurmctld $!" >> "$dir/pids"
    setsid slurmd -D -N localhost < /dev/null > "$dir/log/slurmd.out" 2>&1 &
    echo "slurmd $!" >> "$dir/pids"

    # ready when the node is idle (about 2 s)
    local state=""
    for _ in $(seq 1 60); do
        state=$(sinfo -h -n localhost -o %T 2>/dev/null)
        [ "$state" = idle ] && break
        sleep 0.5
    done
    [ "$state" = idle ] || { echo "slurm_cluster: node state '$state' after 30 s" >&2; false; }
    trap - ERR
    set +E
    echo "SLURM_CLUSTER_DIR=$dir; SLURM_CONF=$dir/slurm.conf; export SLURM_CLUSTER_DIR SLURM_CONF"
}

case ${1:-} in
start) start_cluster "${2:-}" ;;
stop)
    [ -n "${2:-}" ] || die "usage: $0 stop DIR"
    stop_cluster "$2"
    ;;
status)
    [ -n "${2:-}" ] && [ -f "$2/pids" ] || die "usage: $0 status DIR"
    while read -r name pid; do
        if alive "$pid" "$name"; then echo "$name $pid running"; else echo "$name $pid stopped"; fi
    done < "$2/pids"
    SLURM_CONF=$2/slurm.conf sinfo 2>/dev/null
    ;;
*)
    echo "usage: $0 start [DIR] | status DIR | stop DIR" >&2
    exit 2
    ;;
esac
