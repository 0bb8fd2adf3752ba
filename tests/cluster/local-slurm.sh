#!/usr/bin/env bash
# A real multi-node Slurm cluster on one machine, for hpcddp integration tests and CI.
#
# Each node n1..nK runs its own slurmd inside its own network namespace (own IP on a
# Linux bridge) and UTS namespace (own hostname), so code that wrongly uses localhost
# as MASTER_ADDR fails here just as it would on a real cluster. All state lives under
# one folder; /etc/slurm is never touched. Needs root (namespaces, bridge, /etc/hosts).
#
# The nodes have the shape of real ones, where naive network code breaks (the default
# HPCDDP_SLURM_NET_SHAPE=debian): each has its own /etc/hosts (a mount namespace) in which
# its own name is 127.0.1.1, Debian's default line; its cluster interface is named
# differently from its neighbours' (eth0, ens4, ...); and it has a decoy interface ib0,
# created first, on a subnet of its own whose veth peer leads nowhere.
#
# Several clusters can run side by side (one per developer worktree, say): each instance k in
# 1..9 (HPCDDP_SLURM_INSTANCE=k) has its own state folder, subnet, bridge, namespaces, node
# names (c<k>n1, c<k>n2, ...) and controller port. Without it: nodes n1, n2, ... as always.
#
# Usage: local-slurm.sh {start|stop|status|env|shape NODE WHAT}
#   start   start the cluster, or check it when already running (idempotent)
#   stop    kill our daemons and job processes, remove namespaces, links, hosts lines
#   status  print sinfo; exit 0 only when every node is up and responding
#   env     print the environment clients need:  eval "$(local-slurm.sh env)"
#   shape   make one node slow, or undo it: WHAT is link=RATE (tc tbf on what the node
#           sends, e.g. link=40mbit), cpu=PERCENT (cgroup cpu quota of the jobs it starts
#           from now on, e.g. cpu=25), or off (undo both)
set -euo pipefail

INSTANCE="${HPCDDP_SLURM_INSTANCE:-}"
[[ -z $INSTANCE || $INSTANCE =~ ^[1-9]$ ]] ||
    { echo "local-slurm: HPCDDP_SLURM_INSTANCE=$INSTANCE; expected 1..9 or nothing" >&2; exit 2; }
SLURM_DIR="${HPCDDP_SLURM_DIR:-/tmp/hpcddp-slurm${INSTANCE:+-$INSTANCE}}"
NODE_COUNT="${HPCDDP_SLURM_NODES:-2}"
CPUS_PER_NODE="${HPCDDP_SLURM_CPUS_PER_NODE:-4}"
# a /24; controller at .1, node i at .(10+i)
NET_PREFIX="${HPCDDP_SLURM_NET_PREFIX:-10.213.${INSTANCE:-0}}"
BRIDGE="${HPCDDP_SLURM_BRIDGE:-hpcddp-br${INSTANCE:-0}}"   # interface names are at most 15 chars
START_TIMEOUT_S="${HPCDDP_SLURM_START_TIMEOUT_S:-60}"
NET_SHAPE="${HPCDDP_SLURM_NET_SHAPE:-debian}" # debian (the real-node traps above) or plain
[[ $NET_SHAPE == debian || $NET_SHAPE == plain ]] ||
    { echo "local-slurm: HPCDDP_SLURM_NET_SHAPE=$NET_SHAPE; expected debian or plain" >&2; exit 2; }
DECOY_PREFIX="${HPCDDP_SLURM_DECOY_PREFIX:-172.31.${INSTANCE:-0}}" # ib0's /24, inside the nodes only
PARTITION="debug"
NODE_PREFIX="${INSTANCE:+c${INSTANCE}}n"
CTLD_PORT=$((6817 + 10 * ${INSTANCE:-0}))
NS_PREFIX="hpcddp${INSTANCE}-" # netns hpcddp-n1; veth hpcddp-n1h (bridge side) and hpcddp-n1p
HOSTS_MARK="# hpcddp-local-slurm${INSTANCE}"

CONF="$SLURM_DIR/slurm.conf"
RUN_DIR="$SLURM_DIR/run"
LOG_DIR="$SLURM_DIR/log"
CTLD_PID_FILE="$RUN_DIR/slurmctld.pid"
HOSTS_DIR="$SLURM_DIR/hosts" # each node's own /etc/hosts (debian shape)
CGROUP_CPU="/sys/fs/cgroup/cpu"
export SLURM_CONF="$CONF"
export PATH="$PATH:/usr/sbin:/sbin"

log() { printf 'local-slurm: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

node_names() { local i; for ((i = 1; i <= NODE_COUNT; i++)); do echo "$NODE_PREFIX$i"; done; }
node_ip() { echo "$NET_PREFIX.$((10 + ${1#"$NODE_PREFIX"}))"; }
# The node's cluster interface: names differ between nodes, as they do between hardware kinds.
node_if() {
    [[ $NET_SHAPE == debian ]] || { echo eth0; return; }
    if ((${1#"$NODE_PREFIX"} % 2)); then echo eth0; else echo ens4; fi
}
node_cgroup() { echo "$CGROUP_CPU/hpcddp${INSTANCE}-$1"; }

# --- packages and munge -------------------------------------------------------------

ensure_packages() {
    local cmd missing=()
    for cmd in slurmctld slurmd sbatch munged ip; do
        command -v "$cmd" >/dev/null || missing+=("$cmd")
    done
    ((${#missing[@]} == 0)) && return 0
    log "missing ${missing[*]}; installing Slurm and munge with apt-get (about a minute)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q slurmctld slurmd slurm-client munge iproute2
}

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

# munged is a machine-wide service that other tools may share: we start it when it is
# not running, and never stop it.
ensure_munge() {
    munge_works && return 0
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        mungekey -c
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge && chown munge:munge /run/munge
    log "starting munged"
    # --force lets munged replace a stale socket left by a killed munged.
    su -s /bin/sh munge -c '/usr/sbin/munged' </dev/null >/dev/null 2>&1 9>&- ||
        su -s /bin/sh munge -c '/usr/sbin/munged --force' </dev/null >/dev/null 2>&1 9>&- ||
        die "munged failed to start; see /var/log/munge/munged.log"
    local _
    for _ in {1..50}; do munge_works && return 0; sleep 0.1; done
    die "munged runs but 'munge -n | unmunge' fails; see /var/log/munge/munged.log"
}

# --- slurm.conf -------------------------------------------------------------------------

render_conf() {
    local mem_mb node
    mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
    cat <<EOF
# Generated by tests/cluster/local-slurm.sh; rerun it instead of editing this file.
# Node network shape: $NET_SHAPE
ClusterName=hpcddp${INSTANCE}
SlurmctldHost=$(hostname -s)($NET_PREFIX.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MailProg=/bin/true
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool/%n
SlurmctldPidFile=$CTLD_PID_FILE
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No systemd and no cgroup delegation here.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Trust the CPUs declared below even though the machine has fewer cores.
SlurmdParameters=config_overrides
# Start jobs within a second of submission and retry pending ones every second.
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=1,sched_min_interval=0,bf_interval=1
DependencyParameters=kill_invalid_depend
ReturnToService=2
JobRequeue=1
KillWait=5
InactiveLimit=0
MinJobAge=300
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
EOF
    for node in $(node_names); do
        echo "NodeName=$node NodeAddr=$(node_ip "$node") CPUs=$CPUS_PER_NODE RealMemory=$mem_mb State=UNKNOWN"
    done
    echo "PartitionName=$PARTITION Nodes=${NODE_PREFIX}[1-$NODE_COUNT] Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP"
}

# --- network: bridge, one namespace per node, /etc/hosts ----------------------------------

# Docker hosts set the FORWARD policy to DROP and bridged traffic passes iptables when
# br_netfilter is loaded; let traffic between our nodes through.
bridge_firewall() {
    local action=$1
    command -v iptables >/dev/null || return 0
    [[ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" == 1 ]] || return 0
    local rule=(FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT)
    if [[ $action == add ]]; then
        iptables -C "${rule[@]}" 2>/dev/null || iptables -I "${rule[@]}"
    else
        while iptables -C "${rule[@]}" 2>/dev/null; do iptables -D "${rule[@]}"; done
    fi
}

hosts_lines() {
    local node
    for node in $(node_names); do echo "$(node_ip "$node") $node $HOSTS_MARK"; done
}

# Rewrite in place (cat >, not mv): /etc/hosts is often a bind mount in containers.
write_hosts() {
    local wanted=$1 current
    current=$(grep -vF -- "$HOSTS_MARK" /etc/hosts || true)
    [[ -n $wanted ]] && current+=$'\n'"$wanted"
    [[ "$current" == "$(cat /etc/hosts)" ]] || printf '%s\n' "$current" >/etc/hosts
}

our_netns() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${NS_PREFIX}${NODE_PREFIX}[0-9]+\$" || true
}

our_links() {
    ip -o link show 2>/dev/null | awk -F': ' '{sub(/@.*/, "", $2); print $2}' |
        grep -E "^${NS_PREFIX}${NODE_PREFIX}[0-9]+[hpdq]\$" || true
}

# A second interface that leads nowhere: its veth peer stays in the root namespace, up but
# attached to nothing and never forwarding. Created before the cluster interface, so code
# that takes "the first interface" (or NCCL's preference for ib*) picks it.
decoy_up() {
    local node=$1 ns=$2
    ip link add "${ns}d" type veth peer name "${ns}q"
    sysctl -qw "net.ipv4.conf.${ns}d.forwarding=0" 2>/dev/null || true
    ip link set "${ns}d" up
    ip link set "${ns}q" netns "$ns"
    ip -n "$ns" link set "${ns}q" name ib0
    ip -n "$ns" addr add "$DECOY_PREFIX.$((10 + ${node#"$NODE_PREFIX"}))/24" dev ib0
    ip -n "$ns" link set ib0 up
}

# What /etc/hosts says on NODE: this machine's lines, then Debian's "127.0.1.1 <own name>"
# instead of the node's own address, and the other nodes' addresses.
node_hosts() {
    local node=$1 other
    grep -vF -- "$HOSTS_MARK" /etc/hosts || true
    echo "127.0.1.1 $node $HOSTS_MARK"
    for other in $(node_names); do
        [[ $other == "$node" ]] || echo "$(node_ip "$other") $other $HOSTS_MARK"
    done
}

network_up() {
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET_PREFIX.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    bridge_firewall add
    local node ns ifname
    mkdir -p "$HOSTS_DIR"
    for node in $(node_names); do
        ns="$NS_PREFIX$node"
        ifname=$(node_if "$node")
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        if [[ $NET_SHAPE == debian ]]; then decoy_up "$node" "$ns"; fi
        ip link add "${ns}h" type veth peer name "${ns}p"
        ip link set "${ns}h" master "$BRIDGE" up
        ip link set "${ns}p" netns "$ns"
        ip -n "$ns" link set "${ns}p" name "$ifname"
        ip -n "$ns" addr add "$(node_ip "$node")/24" dev "$ifname"
        ip -n "$ns" link set "$ifname" up
        node_hosts "$node" >"$HOSTS_DIR/$node"
    done
    write_hosts "$(hosts_lines)"
}

network_down() {
    local ns link
    for ns in $(our_netns); do ip netns del "$ns" 2>/dev/null || true; done
    # Deleting a namespace may leave the host end of its veth pair behind.
    for link in $(our_links); do ip link del "$link" 2>/dev/null || true; done
    bridge_firewall del
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
    write_hosts ""
}

# --- daemons ------------------------------------------------------------------------------

# A process killed a moment ago lingers as a zombie until init reaps it: count it dead.
is_alive() {
    local state
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [[ -n $state && ! $state =~ ^[ZX]$ ]]
}

# Prints the pid in FILE if that process is alive and is the daemon NAME.
live_pid() {
    local file=$1 name=$2 pid
    [[ -r $file ]] || return 1
    pid=$(<"$file")
    [[ $pid =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$name" ]] || return 1
    is_alive "$pid" && echo "$pid"
}

# Every process we own: our daemons (by pid file) and everything inside our namespaces
# (slurmd, slurmstepd and the job tasks they launched).
our_pids() {
    local file ns pid
    live_pid "$CTLD_PID_FILE" slurmctld || true
    for file in "$RUN_DIR"/slurmd-*.pid; do live_pid "$file" slurmd || true; done
    for ns in $(our_netns); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            if is_alive "$pid"; then echo "$pid"; fi
        done
    done
}

daemons_down() {
    local pids pid daemons=() others=() _
    pids=$(our_pids | sort -un)
    [[ -z $pids ]] && return 0
    log "stopping Slurm daemons and job processes: ${pids//$'\n'/ }"
    for pid in $pids; do
        case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
            slurmctld | slurmd) daemons+=("$pid") ;;
            *) others+=("$pid") ;;
        esac
    done
    # Job processes are killed outright: slurmstepd blocks SIGTERM, and an srun inside a
    # batch script waits for steps whose slurmstepd is already gone.
    ((${#others[@]} == 0)) || kill -KILL "${others[@]}" 2>/dev/null || true
    ((${#daemons[@]} == 0)) || kill -TERM "${daemons[@]}" 2>/dev/null || true
    for _ in {1..100}; do
        pids=$(for pid in $pids; do if is_alive "$pid"; then echo "$pid"; fi; done)
        [[ -z $pids ]] && return 0
        sleep 0.1
    done
    log "still alive after 10 s, killing: ${pids//$'\n'/ }"
    # shellcheck disable=SC2086  # one pid per word
    kill -KILL $pids 2>/dev/null || true
    sleep 0.5
}

daemons_up() {
    log "starting slurmctld"
    slurmctld -f "$CONF" </dev/null >>"$LOG_DIR/slurmctld.stdout" 2>&1 9>&- ||
        fail_with_logs "slurmctld did not start"
    local node hosts
    for node in $(node_names); do
        log "starting slurmd $node ($(node_ip "$node") on $(node_if "$node"), shape $NET_SHAPE)"
        # The node's own /etc/hosts is bind-mounted in a mount namespace of its own (private,
        # so nothing leaks back); the plain shape shares this machine's.
        hosts=/etc/hosts
        [[ $NET_SHAPE == debian ]] && hosts="$HOSTS_DIR/$node"
        # Not 'ip netns exec': it remounts /sys and slurmd then dies with
        # "No filesystem mounted on /sys/fs/cgroup".
        # shellcheck disable=SC2016  # $1..$3 are the inner shell's arguments
        nsenter --net="/run/netns/$NS_PREFIX$node" unshare --uts --mount --propagation private \
            sh -c '{ [ "$3" = /etc/hosts ] || mount --bind "$3" /etc/hosts; } &&
                hostname "$1" && exec slurmd -f "$2" -N "$1"' sh "$node" "$CONF" "$hosts" \
            </dev/null >>"$LOG_DIR/slurmd-$node.stdout" 2>&1 9>&- ||
            fail_with_logs "slurmd $node did not start"
    done
}

# --- slow nodes, for tests that must find them ------------------------------------------

shape_link() {
    local node=$1 rate=$2 ns="$NS_PREFIX$1" ifname
    ifname=$(node_if "$node")
    tc -n "$ns" qdisc del dev "$ifname" root 2>/dev/null || true
    [[ $rate == off ]] && return 0
    # tbf, not netem (not in every kernel): what the node sends leaves at RATE at most.
    tc -n "$ns" qdisc add dev "$ifname" root tbf rate "$rate" burst 64kb latency 100ms
}

# cgroup v1 cpu quota on the node's slurmd: the jobs it starts from now on inherit it.
shape_cpu() {
    local node=$1 percent=$2 group pid
    group=$(node_cgroup "$node")
    pid=$(live_pid "$RUN_DIR/slurmd-$node.pid" slurmd) || die "slurmd $node is not running"
    if [[ $percent == off ]]; then
        [[ -d $group ]] || return 0
        while read -r pid; do echo "$pid" >"$CGROUP_CPU/cgroup.procs" || true; done <"$group/cgroup.procs"
        rmdir "$group"
        return 0
    fi
    [[ -d $CGROUP_CPU ]] || die "no cgroup v1 cpu controller at $CGROUP_CPU"
    mkdir -p "$group"
    echo 100000 >"$group/cpu.cfs_period_us"
    echo $((percent * 1000)) >"$group/cpu.cfs_quota_us"
    echo "$pid" >"$group/cgroup.procs"
}

cmd_shape() {
    local node=${1:-} what=${2:-}
    [[ $(id -u) == 0 ]] || die "must run as root"
    node_names | grep -qx -- "$node" || die "shape: unknown node '$node'; nodes: $(node_names | tr '\n' ' ')"
    case $what in
        link=*) shape_link "$node" "${what#link=}" ;;
        cpu=*) [[ ${what#cpu=} =~ ^[1-9][0-9]*$ ]] || die "shape: cpu=PERCENT, got $what"
            shape_cpu "$node" "${what#cpu=}" ;;
        off) shape_link "$node" off; shape_cpu "$node" off ;;
        *) die "shape: expected link=RATE, cpu=PERCENT or off; got '$what'" ;;
    esac
    log "shaped $node: $what"
}

# --- health ---------------------------------------------------------------------------------

daemons_alive() {
    live_pid "$CTLD_PID_FILE" slurmctld >/dev/null || return 1
    local node
    for node in $(node_names); do
        live_pid "$RUN_DIR/slurmd-$node.pid" slurmd >/dev/null || return 1
    done
}

# Succeeds when every daemon is alive and sinfo reports every node up and responding.
cluster_healthy() {
    daemons_alive || return 1
    local states
    states=$(timeout 15 sinfo -h -N -p "$PARTITION" -o '%N %T' 2>/dev/null) || return 1
    # A trailing '*' (not responding), drain, down etc. all fail this match.
    [[ $(grep -cE "^${NODE_PREFIX}[0-9]+ (idle|mixed|allocated|completing)\$" <<<"$states") == "$NODE_COUNT" ]]
}

elapsed_s() { awk -v t0="$1" -v t1="$EPOCHREALTIME" 'BEGIN {printf "%.1f", t1 - t0}'; }

wait_healthy() {
    local deadline=$((SECONDS + $1))
    until cluster_healthy; do
        ((SECONDS < deadline)) || return 1
        sleep 0.2
    done
}

fail_with_logs() {
    local file
    log "$*; node states and log tails follow"
    timeout 5 sinfo -N -l >&2 2>&1 || true
    for file in "$LOG_DIR"/*; do
        [[ -s $file ]] || continue
        printf '\n==> %s (last 25 lines) <==\n' "$file" >&2
        tail -n 25 "$file" >&2
    done
    printf '\n' >&2
    die "$* (HINT: read the logs above or under $LOG_DIR; '$0 stop' then '$0 start' retries from scratch)"
}

# --- subcommands ----------------------------------------------------------------------------

# Serialises start and stop, e.g. when several test workers call start at once. Daemons
# are started with fd 9 closed, or they would hold the lock for ever.
take_lock() {
    [[ -n ${LOCK_HELD:-} ]] && return 0
    LOCK_HELD=1
    mkdir -p "$SLURM_DIR"
    exec 9>"$SLURM_DIR/lock"
    flock -w 120 9 || die "another local-slurm.sh holds $SLURM_DIR/lock for over 120 s"
}

cmd_start() {
    local t0=$EPOCHREALTIME
    [[ $(id -u) == 0 ]] || die "must run as root (network namespaces, bridge, /etc/hosts)"
    if ! [[ $NODE_COUNT =~ ^[0-9]+$ ]] || ((NODE_COUNT < 1 || NODE_COUNT > 200)); then
        die "HPCDDP_SLURM_NODES=$NODE_COUNT; expected a number in 1..200"
    fi
    take_lock
    ensure_packages
    ensure_munge
    if [[ -r $CONF && "$(render_conf)" == "$(<"$CONF")" ]] && daemons_alive && wait_healthy 10; then
        write_hosts "$(hosts_lines)"
        log "already running and healthy ($NODE_COUNT nodes); nothing to do"
        return 0
    fi
    [[ -n "$(our_pids)$(our_netns)" ]] && log "found an unhealthy or outdated cluster; cleaning up"
    cmd_stop
    rm -rf "$SLURM_DIR/state" "$SLURM_DIR/spool" "$RUN_DIR" "$LOG_DIR" "$HOSTS_DIR"
    mkdir -p "$SLURM_DIR/state" "$RUN_DIR" "$LOG_DIR"
    local node
    for node in $(node_names); do install -d -m 755 "$SLURM_DIR/spool/$node"; done
    render_conf >"$CONF"
    network_up
    daemons_up
    wait_healthy "$START_TIMEOUT_S" ||
        fail_with_logs "nodes not idle within ${START_TIMEOUT_S}s (HPCDDP_SLURM_START_TIMEOUT_S)"
    log "cluster up in $(elapsed_s "$t0")s: $NODE_COUNT nodes, partition $PARTITION; SLURM_CONF=$CONF"
}

cmd_stop() {
    [[ $(id -u) == 0 ]] || die "must run as root"
    take_lock
    local node
    for node in $(node_names); do
        [[ -d $(node_cgroup "$node") ]] && { shape_cpu "$node" off 2>/dev/null || true; }
    done
    daemons_down
    for node in $(node_names); do rmdir "$(node_cgroup "$node")" 2>/dev/null || true; done
    rm -f "$RUN_DIR"/*.pid 2>/dev/null || true
    network_down
}

cmd_status() {
    if [[ ! -r $CONF ]]; then
        log "not running (no $CONF)"
        return 1
    fi
    timeout 15 sinfo || true
    if cluster_healthy; then
        log "healthy: $NODE_COUNT nodes up"
        return 0
    fi
    log "unhealthy or stopped (HINT: '$0 start' repairs it; logs under $LOG_DIR)"
    return 1
}

# SLURM_CONF for the clients; the login node's address on the nodes' network (for test servers),
# the prefix of the nodes' network namespaces (/run/netns/<prefix><node>), the shape of the
# nodes' network and each node's cluster interface (node=ifname, space-separated).
cmd_env() {
    local node ifnames=()
    for node in $(node_names); do ifnames+=("$node=$(node_if "$node")"); done
    printf 'export SLURM_CONF=%q\n' "$CONF"
    printf 'export HPCDDP_SLURM_LOGIN_ADDR=%q\n' "$NET_PREFIX.1"
    printf 'export HPCDDP_SLURM_NETNS_PREFIX=%q\n' "$NS_PREFIX"
    printf 'export HPCDDP_SLURM_NET_SHAPE=%q\n' "$NET_SHAPE"
    printf 'export HPCDDP_SLURM_IFNAMES=%q\n' "${ifnames[*]}"
}

main() {
    case "${1:-}" in
        start) cmd_start ;;
        stop) cmd_stop ;;
        status) cmd_status ;;
        env) cmd_env ;;
        shape) take_lock; cmd_shape "${@:2}" ;;
        *)
            sed -n '19,26p' "$0" >&2
            exit 2
            ;;
    esac
}

main "$@"
