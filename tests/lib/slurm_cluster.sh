#!/bin/bash
# slurm_cluster.sh — a private Slurm cluster on this machine, for tests and trials: one node on
# localhost, or N nodes (1..8), each in a network namespace of its own.
#
#   eval "$(tests/lib/slurm_cluster.sh start)"              # one node, "localhost"
#   eval "$(tests/lib/slurm_cluster.sh start --nodes 2)"    # two nodes, node1 and node2
#   sbatch ... ; squeue ...                  # clients find the cluster through SLURM_CONF
#   tests/lib/slurm_cluster.sh status "$SLURM_CLUSTER_DIR"
#   tests/lib/slurm_cluster.sh stop "$SLURM_CLUSTER_DIR"   # idempotent: a second stop does nothing
#
# `start` prints shell assignments: SLURM_CLUSTER_DIR and SLURM_CONF always; with --nodes N also
# SLURM_CLUSTER_NODES (node names), SLURM_CLUSTER_ADDRS (their addresses) and
# SLURM_CLUSTER_LINKS (the root-namespace end of each node's veth, in node order: its
# /sys/class/net/LINK/statistics counters see every byte the node sends or receives).
#
# Everything lives in one temp directory: munge key and socket, slurm.conf, state, spool, logs,
# and a file `pids` naming the daemons started (munged, slurmctld, one slurmd per node).
# `stop` cancels the cluster's jobs, ends exactly those daemons (and any job process left
# behind that carries this cluster's SLURM_CONF, or that is still inside a node's namespace),
# removes the namespaces and devices, then the directory.
#
# --nodes N: a bridge in the root namespace holds 10.213.X.1/24 (X picked at random among the
# /24s that no address or route here uses); node i is the network namespace pipelm-TAG-nodei
# holding one end of a veth pair (address 10.213.X.(i+1)), the other end on the bridge. Its
# slurmd runs inside that namespace and inside a UTS namespace of its own (hostname nodei), with
# NodeAddr = its address, so nothing needs /etc/hosts. slurmctld and munged stay in the root
# namespace: slurmctld listens on every address (SlurmctldHost=localhost(10.213.X.1) tells the
# nodes where), and munge's socket is a file, which every namespace reaches. Node-to-node
# traffic goes veth -> bridge -> veth (bridged: no IP forwarding to turn on). The file `net`
# lists the bridge, veths and namespaces; each is written there before it is made, so `stop`
# removes whatever a failed start made.
#
# Needs root (slurmd starts jobs as their owner; namespaces) and Debian's slurm-wlm and munge
# packages; --nodes also needs ip (iproute2), nsenter and unshare (util-linux).
# Setup facts (no systemd; linuxproc proctrack; pmi2): see the project's toolchain notes.
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

# net_items DIR KIND: the names of one kind (netns, veth, bridge) listed in DIR/net
net_items() { awk -v k="$2" '$1 == k {print $2}' "$1/net"; }
has_netns() { ip netns list 2> /dev/null | awk '{print $1}' | grep -qxF "$1"; }
has_link() { ip link show "$1" > /dev/null 2>&1; }

# stop_net DIR: remove the namespaces, veths and bridge listed in DIR/net, killing whatever still
# runs inside a namespace first (a process keeps its namespace alive after `ip netns del`).
# The kernel frees a deleted namespace and its devices asynchronously: wait (bounded) until
# they are gone, so that a caller checking for leftovers right after sees none.
stop_net() {
    local dir=$1 name pids left
    [ -f "$dir/net" ] || return 0
    for name in $(net_items "$dir" netns); do
        has_netns "$name" || continue
        pids=$(ip netns pids "$name" 2> /dev/null)
        [ -n "$pids" ] || continue
        echo "slurm_cluster: killing processes left in $name:" $pids >&2
        # shellcheck disable=SC2086 # one PID per word
        kill -KILL $pids 2> /dev/null
        for _ in $(seq 1 25); do [ -z "$(ip netns pids "$name" 2> /dev/null)" ] && break; sleep 0.2; done
    done
    # veths first (deleting one end deletes the pair), then the namespaces, then the bridge
    for name in $(net_items "$dir" veth); do has_link "$name" && ip link del "$name" 2> /dev/null; done
    for name in $(net_items "$dir" netns); do has_netns "$name" && ip netns del "$name" 2> /dev/null; done
    for name in $(net_items "$dir" bridge); do has_link "$name" && ip link del "$name" 2> /dev/null; done
    for _ in $(seq 1 50); do
        left=""
        for name in $(net_items "$dir" veth) $(net_items "$dir" bridge); do
            has_link "$name" && left="$left $name"
        done
        for name in $(net_items "$dir" netns); do has_netns "$name" && left="$left $name"; done
        [ -z "$left" ] && return 0
        sleep 0.2
    done
    echo "slurm_cluster: warning: still there after 10 s:$left" >&2
    return 1
}

stop_cluster() {
    local dir=$1
    # nothing there: already stopped (stop is idempotent; test traps call it on every exit)
    [ -e "$dir" ] || return 0
    [ -f "$dir/pids" ] || die "$dir is not a cluster made by this script"
    export SLURM_CONF=$dir/slurm.conf
    # end the jobs first so no slurmstepd outlives its slurmd
    if [ -f "$dir/slurm.conf" ] && alive "$(awk '$1 == "slurmctld" {print $2}' "$dir/pids")" slurmctld; then
        timeout 10 scancel --full --quiet --user="$(id -un)" 2>/dev/null
        for _ in $(seq 1 30); do
            [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    # daemons in reverse start order: the slurmd(s), slurmctld, munged
    local name pid
    while read -r name pid; do
        [ -n "$pid" ] && alive "$pid" "$name" || continue
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 1 50); do alive "$pid" "$name" || break; sleep 0.2; done
        if alive "$pid" "$name"; then
            echo "slurm_cluster: $name ($pid) ignored SIGTERM: SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null
        fi
    done < <(tac "$dir/pids")
    # job processes left behind (a step killed mid-way) carry this cluster's SLURM_CONF
    local left
    left=$(cluster_procs "$dir/slurm.conf")
    if [ -n "$left" ]; then
        echo "slurm_cluster: killing leftover job processes:" "$left" >&2
        # shellcheck disable=SC2086 # one PID per word
        kill -KILL $left 2> /dev/null
    fi
    stop_net "$dir"
    # the nodes' mounts (run/cgroup-node*) live in their private mount namespaces, gone with
    # their last process; never recurse into a mount that is somehow visible here
    if awk -v d="$dir/" 'index($5 "/", d) == 1 {found = 1} END {exit !found}' /proc/self/mountinfo; then
        echo "slurm_cluster: something is mounted under $dir: not removing it" >&2
        return 1
    fi
    rm -rf "$dir"
}

# pick_net DIR: a tag for device and namespace names that nothing uses yet, and a /24 under
# 10.213/16 that no address or route here touches; written to DIR/net as "tag T", "subnet S"
pick_net() {
    local dir=$1 tag="" x tries
    for ((tries = 0; tries < 50; tries++)); do
        tag=plm$(printf '%04x' $((RANDOM % 65536)))
        ip -o link show 2> /dev/null | grep -q "$tag" && continue
        ip netns list 2> /dev/null | grep -q "pipelm-$tag-" && continue
        break
    done
    for ((tries = 0; tries < 100; tries++)); do
        x=$((16 + RANDOM % 224))
        ip -4 -o addr show 2> /dev/null | grep -q " 10\.213\.$x\." && continue
        # `route show match` lists every route covering the /24; only the default may
        [ -z "$(ip -4 route show match "10.213.$x.0/24" 2> /dev/null | grep -v '^default')" ] || continue
        printf 'tag %s\nsubnet 10.213.%s\n' "$tag" "$x" >> "$dir/net"
        return 0
    done
    return 1
}

# make_net DIR N: the bridge (SUBNET.1) and N namespaces, node i at SUBNET.(i+1)
make_net() {
    local dir=$1 n=$2 tag sub i ns
    tag=$(sed -n 's/^tag //p' "$dir/net")
    sub=$(sed -n 's/^subnet //p' "$dir/net")
    echo "bridge ${tag}br" >> "$dir/net"
    ip link add "${tag}br" type bridge
    ip addr add "$sub.1/24" dev "${tag}br"
    ip link set "${tag}br" up
    for ((i = 1; i <= n; i++)); do
        ns=pipelm-$tag-node$i
        printf 'netns %s\nveth %s\n' "$ns" "${tag}h$i" >> "$dir/net"
        ip netns add "$ns"
        ip link add "${tag}h$i" type veth peer name "${tag}v$i"
        ip link set "${tag}h$i" master "${tag}br" up
        ip link set "${tag}v$i" netns "$ns"
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$sub.$((i + 1))/24" dev "${tag}v$i"
        ip -n "$ns" link set "${tag}v$i" up
    done
}

start_cluster() {
    local dir="" nodes=0
    while [ $# -gt 0 ]; do
        case $1 in
        --nodes) nodes=${2:-}; shift ;;
        --nodes=*) nodes=${1#*=} ;;
        -*) die "unknown option $1" ;;
        *) dir=$1 ;;
        esac
        shift
    done
    # 0 (no --nodes): the single node "localhost" in this namespace; N: N namespaced nodes
    [[ $nodes =~ ^[0-8]$ ]] || die "--nodes takes 1..8 (got '$nodes')"
    for cmd in munged mungekey slurmctld slurmd sbatch squeue sinfo scontrol; do
        command -v $cmd > /dev/null || die "$cmd not found (apt-get install slurm-wlm munge)"
    done
    [ "$(id -u)" -eq 0 ] || die "needs root (slurmd runs jobs as their owner)"
    if [ "$nodes" -gt 0 ]; then
        for cmd in ip nsenter unshare; do
            command -v $cmd > /dev/null || die "--nodes needs $cmd (iproute2, util-linux)"
        done
    fi
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
    # a start that is killed (a caller's timeout) takes down what it made, too
    trap 'trap - ERR; echo "slurm_cluster: start interrupted" >&2; stop_cluster "$dir"; exit 1' INT TERM
    set -E

    # the network first: where namespaces are not allowed this fails before any daemon runs
    local sub="" tag="" names="" addrs="" links="" i
    if [ "$nodes" -gt 0 ]; then
        : > "$dir/net"
        pick_net "$dir" || { echo "slurm_cluster: no free 10.213.X.0/24 here" >&2; false; }
        tag=$(sed -n 's/^tag //p' "$dir/net")
        sub=$(sed -n 's/^subnet //p' "$dir/net")
        make_net "$dir" "$nodes"
        for ((i = 1; i <= nodes; i++)); do
            names="$names node$i"
            addrs="$addrs $sub.$((i + 1))"
            links="$links ${tag}h$i"
        done
        names=${names# } addrs=${addrs# } links=${links# }
    fi

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
    # one node: localhost at 127.0.0.1. N nodes: node1..nodeN at their namespaces' addresses
    # (every slurmd has its own address, so they can share the port), slurmctld at the bridge's
    # (named localhost all the same: slurmctld only starts on a host its SlurmctldHost names)
    local ctld_host=localhost node_lines="" part_nodes=localhost what="one node (localhost)"
    if [ "$nodes" -gt 0 ]; then
        ctld_host="localhost($sub.1)"
        for ((i = 1; i <= nodes; i++)); do
            node_lines="${node_lines}NodeName=node$i NodeAddr=$sub.$((i + 1)) $hw State=UNKNOWN
"
        done
        part_nodes=node[1-$nodes]
        what="$nodes node(s) in network namespaces on $sub.0/24"
    else
        node_lines="NodeName=localhost NodeAddr=127.0.0.1 $hw State=UNKNOWN
"
    fi
    cat > "$dir/slurm.conf" <<EOF
# written by tests/lib/slurm_cluster.sh: $what, one partition, no accounting
ClusterName=pipelmtest
SlurmctldHost=$ctld_host
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
# a requeued job becomes eligible once its hold (above) ends, and only the periodic scheduling
# passes start it (default every 60 s, backfill every 30 s): every 2 s here, a few jobs on one
# or two nodes, so the tests wait for the jobs, not for the scheduler
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
JobRequeue=1
InactiveLimit=0
KillWait=10
MinJobAge=600
SlurmdTimeout=${SLURM_CLUSTER_SLURMD_TIMEOUT:-60}
${node_lines}PartitionName=debug Nodes=$part_nodes Default=YES MaxTime=INFINITE State=UP
EOF
    : > "$dir/plugstack.conf"
    export SLURM_CONF=$dir/slurm.conf

    setsid slurmctld -D -i < /dev/null > "$dir/log/slurmctld.out" 2>&1 &
    echo "slurmctld $!" >> "$dir/pids"
    if [ "$nodes" -gt 0 ]; then
        # each slurmd in its node's network namespace, a UTS namespace of its own (the node's
        # jobs see hostname nodeI) and a mount namespace of its own, where /sys is a sysfs of
        # the node's network namespace: UCX, MPICH and hwloc list network devices from
        # /sys/class/net, and with the root namespace's /sys they would find only "lo" (UCX
        # then fails: "tcp/lo - Destination is unreachable"). The cgroup tree is moved onto
        # the new /sys, because slurmd will not start without it ("Unable to initialize cgroup
        # plugin"): that is why this is not `ip netns exec`, which remounts /sys without it.
        # nsenter, unshare and sh all exec: $! is slurmd.
        for ((i = 1; i <= nodes; i++)); do
            mkdir -p "$dir/run/cgroup-node$i"
            setsid nsenter --net="/run/netns/pipelm-$tag-node$i" unshare --uts --mount --propagation private \
                sh -c 'hostname "$1" && mount --rbind /sys/fs/cgroup "$2" && mount -t sysfs sysfs /sys &&
                       mount --move "$2" /sys/fs/cgroup && exec slurmd -D -N "$1"' sh "node$i" "$dir/run/cgroup-node$i" \
                < /dev/null > "$dir/log/slurmd-node$i.out" 2>&1 &
            echo "slurmd $!" >> "$dir/pids"
        done
    else
        setsid slurmd -D -N localhost < /dev/null > "$dir/log/slurmd.out" 2>&1 &
        echo "slurmd $!" >> "$dir/pids"
    fi

    # ready when every node is idle (about 2 s)
    local state="" want="idle " n=1
    [ "$nodes" -eq 0 ] || n=$nodes
    want=$(printf 'idle %.0s' $(seq 1 $n))
    local name pid
    for _ in $(seq 1 60); do
        state=$(sinfo -h -N -o %T 2>/dev/null | tr '\n' ' ')
        [ "$state" = "$want" ] && break
        # a daemon that died will not come back: fail now, not after 30 s
        while read -r name pid; do
            alive "$pid" "$name" || { echo "slurm_cluster: $name ($pid) died" >&2; false; }
        done < "$dir/pids"
        sleep 0.5
    done
    [ "$state" = "$want" ] || { echo "slurm_cluster: node states '$state' after 30 s" >&2; false; }
    trap - ERR INT TERM
    set +E
    echo "SLURM_CLUSTER_DIR=$dir; SLURM_CONF=$dir/slurm.conf; export SLURM_CLUSTER_DIR SLURM_CONF"
    if [ "$nodes" -gt 0 ]; then
        echo "SLURM_CLUSTER_NODES='$names'; SLURM_CLUSTER_ADDRS='$addrs'; SLURM_CLUSTER_LINKS='$links'"
        echo "export SLURM_CLUSTER_NODES SLURM_CLUSTER_ADDRS SLURM_CLUSTER_LINKS"
    fi
}

case ${1:-} in
start)
    shift
    start_cluster "$@"
    ;;
stop)
    [ -n "${2:-}" ] || die "usage: $0 stop DIR"
    stop_cluster "$2"
    ;;
status)
    [ -n "${2:-}" ] && [ -f "$2/pids" ] || die "usage: $0 status DIR"
    while read -r name pid; do
        if alive "$pid" "$name"; then echo "$name $pid running"; else echo "$name $pid stopped"; fi
    done < "$2/pids"
    [ ! -f "$2/net" ] || grep -E '^(subnet|bridge|veth|netns) ' "$2/net"
    SLURM_CONF=$2/slurm.conf sinfo 2>/dev/null
    ;;
*)
    echo "usage: $0 start [--nodes N] [DIR] | status DIR | stop DIR" >&2
    exit 2
    ;;
esac
