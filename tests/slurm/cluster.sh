#!/usr/bin/env bash
# A Slurm test cluster on this one host, for fk-agentd's Slurm lease backend.
#
#   tests/slurm/cluster.sh up DIR     install (Debian packages) if needed, start munge, a
#                                     MariaDB server and slurmdbd (job accounting, for sacct),
#                                     slurmctld and two slurmd nodes (n1, n2) with 4 fake GPUs
#                                     each, and write DIR/fk-agentd.toml for them
#   tests/slurm/cluster.sh down DIR   stop everything `up` started in DIR
#   tests/slurm/cluster.sh env DIR    print the `export SLURM_CONF=…` line for a shell
#
# Everything lives under DIR (configs, keys, sockets, state, logs, fake device nodes). The fake
# GPUs are character devices made with mknod (Slurm refuses regular files and drops file-less
# GPUs, see the reference notes), so Slurm's GRES accounting and CUDA_VISIBLE_DEVICES work as on
# a real node. Needs root (mknod, slurmd's cgroups). `up` is idempotent: a cluster that is already
# up is left as it is. Exit codes: 0 up/down, 3 the cluster cannot start (the reason printed).
set -euo pipefail

usage() { echo "usage: $0 up|down|env DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
mkdir -p "$2"
W=$(cd "$2" && pwd)
NODES=(n1 n2)
GPUS_PER_NODE=4
CTLD_PORT=${FK_SLURM_CTLD_PORT:-16817}
NODE_PORT0=${FK_SLURM_NODE_PORT:-16818}
DBD_PORT=${FK_SLURM_DBD_PORT:-16830}
DB_PORT=${FK_SLURM_DB_PORT:-16831}
HOST=$(hostname -s)
export SLURM_CONF=$W/slurm.conf

say() { echo "cluster.sh: $*"; }
# While `up` starts daemons, a failure stops what it started, so nothing is left half up.
STARTING=0
fail() {
    echo "cluster.sh: cannot start the cluster: $*" >&2
    [ "$STARTING" -eq 1 ] && down >/dev/null 2>&1
    exit 3
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() {
    local f=$1 name=$2 pid
    if alive "$f"; then
        pid=$(cat "$f")
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        say "stopped $name (pid $pid)"
    fi
    rm -f "$f"
}

down() {
    if [ -f "$W/slurm.conf" ] && alive "$W/run/slurmctld.pid"; then
        # Jobs first, so that no step outlives its slurmd.
        scancel --quiet --full --signal=KILL --user="$(id -un)" 2>/dev/null || true
        scancel --quiet --user="$(id -un)" 2>/dev/null || true
    fi
    for n in "${NODES[@]}"; do stop_pidfile "$W/run/slurmd-$n.pid" "slurmd $n" & done
    wait
    stop_pidfile "$W/run/slurmctld.pid" slurmctld
    stop_pidfile "$W/run/slurmdbd.pid" slurmdbd
    stop_pidfile "$W/run/mariadb.pid" mariadbd
    stop_pidfile "$W/munge/munged.pid" munged
    # slurmstepd processes of this cluster (their spool is ours) that did not end with slurmd.
    local left
    left=$(pgrep -f "slurmstepd.*" 2>/dev/null || true)
    for pid in $left; do
        if tr '\0' ' ' <"/proc/$pid/environ" 2>/dev/null | grep -q "SLURM_CONF=$W/slurm.conf"; then
            kill -KILL "$pid" 2>/dev/null && say "killed leftover slurmstepd $pid"
        fi
    done
    # Empty per-node cgroups slurmd made (v1 and v2 layouts); those still busy stay.
    for n in "${NODES[@]}"; do
        find /sys/fs/cgroup -depth -type d -name "slurm_$n" 2>/dev/null | while read -r d; do
            find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        done
    done
}

install_packages() {
    local missing=()
    for b in slurmctld slurmd munged sbatch slurmdbd mariadbd mariadb-install-db; do
        command -v "$b" >/dev/null 2>&1 || missing+=("$b")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || fail "missing ${missing[*]} and not root to install them"
    command -v apt-get >/dev/null 2>&1 || fail "missing ${missing[*]} and no apt-get"
    local pkgs="slurmctld slurmd slurm-client munge slurmdbd mariadb-server"
    say "installing $pkgs (missing: ${missing[*]})"
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $pkgs >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends \
            $pkgs >/dev/null 2>&1; } \
        || fail "apt-get install $pkgs failed"
}

write_configs() {
    mkdir -p "$W"/{munge,run,log,state,spool,dev}
    chmod 700 "$W/munge"
    if [ ! -s "$W/munge/munge.key" ]; then
        head -c 1024 /dev/urandom >"$W/munge/munge.key"
        chmod 600 "$W/munge/munge.key"
    fi
    local cgroup_plugin=cgroup/v1
    [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && cgroup_plugin=cgroup/v2
    local i=0 minor=0 nodes_conf="" gres_conf="AutoDetect=off"$'\n'
    for n in "${NODES[@]}"; do
        mkdir -p "$W/dev/$n" "$W/spool/$n"
        for g in $(seq 0 $((GPUS_PER_NODE - 1))); do
            [ -c "$W/dev/$n/nvidia$g" ] || mknod "$W/dev/$n/nvidia$g" c 195 $minor \
                || fail "mknod $W/dev/$n/nvidia$g (needs root)"
            minor=$((minor + 1))
        done
        nodes_conf+="NodeName=$n NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((NODE_PORT0 + i)) CPUs=16 RealMemory=8000 Gres=gpu:$GPUS_PER_NODE State=UNKNOWN"$'\n'
        gres_conf+="NodeName=$n Name=gpu File=$W/dev/$n/nvidia[0-$((GPUS_PER_NODE - 1))]"$'\n'
        i=$((i + 1))
    done
    cat >"$W/slurm.conf" <<EOF
# Written by tests/slurm/cluster.sh: a test cluster of two nodes on one host (fake GPUs).
ClusterName=fktest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$W/munge/sock
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool/%n
SlurmctldPidFile=$W/run/slurmctld.pid
SlurmdPidFile=$W/run/slurmd-%n.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdLogFile=$W/log/slurmd-%n.log
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
MpiDefault=none
KillWait=5
MinJobAge=300
ReturnToService=2
SlurmdTimeout=10
InactiveLimit=0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageTRES=gres/gpu
# The munge socket for talking to slurmdbd (Slurm reads it from this key, not AuthInfo).
AccountingStoragePass=$W/munge/sock
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$W/log/jobcomp.txt
JobRequeue=1
SlurmdParameters=config_overrides
$nodes_conf
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    printf '%s' "$gres_conf" >"$W/gres.conf"
    # slurmdbd reads slurmdbd.conf beside slurm.conf; it must be private to SlurmUser.
    cat >"$W/slurmdbd.conf" <<EOF
# Written by tests/slurm/cluster.sh: job accounting for the test cluster (sacct).
AuthType=auth/munge
AuthInfo=socket=$W/munge/sock
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$W/run/slurmdbd.pid
LogFile=$W/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=root
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$W/slurmdbd.conf"
    cat >"$W/cgroup.conf" <<EOF
CgroupPlugin=$cgroup_plugin
ConstrainDevices=yes
EOF
    mkdir -p "$W/runs"
    cat >"$W/fk-agentd.toml" <<EOF
# Written by tests/slurm/cluster.sh for the test cluster in this folder.
[gpus]
backend = "slurm"

[slurm]
conf = "$W/slurm.conf"
partition = "gpu"
nodes = ["n1", "n2"]
gpus_per_node = $GPUS_PER_NODE
hold_time = "2h"
shared_root = "$W/runs"
EOF
}

wait_idle() {
    local want=${#NODES[@]} states
    for _ in $(seq 1 150); do
        states=$(sinfo -h -N -o '%N %T' 2>/dev/null || true)
        if [ "$(grep -cE ' (idle|mixed|allocated)$' <<<"$states")" -ge "$want" ]; then
            say "nodes: $(tr '\n' ' ' <<<"$states")"
            return 0
        fi
        sleep 0.2
    done
    fail "nodes not idle after 30 s ($(tr '\n' ' ' <<<"${states:-no answer}")); see $W/log"
}

# A MariaDB server of this cluster only (its data, socket and port under DIR, grant tables off,
# so it listens on 127.0.0.1 alone), then slurmdbd on it, then the cluster registered.
start_accounting() {
    if [ ! -d "$W/db/mysql" ]; then
        mariadb-install-db --user=root --datadir="$W/db" --auth-root-authentication-method=normal \
            --skip-test-db >>"$W/log/mariadb-install.log" 2>&1 \
            || fail "mariadb-install-db failed; see $W/log/mariadb-install.log"
    fi
    mariadbd --no-defaults --user=root --datadir="$W/db" --socket="$W/run/mariadb.sock" \
        --pid-file="$W/run/mariadb.pid" --port="$DB_PORT" --bind-address=127.0.0.1 \
        --skip-grant-tables --log-error="$W/log/mariadb.log" >/dev/null 2>&1 &
    for _ in $(seq 1 150); do
        [ -S "$W/run/mariadb.sock" ] && alive "$W/run/mariadb.pid" && break
        sleep 0.2
    done
    alive "$W/run/mariadb.pid" || fail "mariadbd did not start; see $W/log/mariadb.log"
    say "started mariadbd ($(cat "$W/run/mariadb.pid")) on port $DB_PORT"
    slurmdbd 2>>"$W/log/start.err" || fail "slurmdbd did not start; see $W/log/slurmdbd.log"
    for _ in $(seq 1 150); do
        alive "$W/run/slurmdbd.pid" && sacctmgr -n list cluster >/dev/null 2>&1 && break
        sleep 0.2
    done
    alive "$W/run/slurmdbd.pid" || fail "slurmdbd exited; see $W/log/slurmdbd.log"
    say "started slurmdbd ($(cat "$W/run/slurmdbd.pid")) on port $DBD_PORT"
    if ! sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx fktest; then
        sacctmgr -i add cluster fktest >>"$W/log/start.err" 2>&1 \
            || fail "sacctmgr add cluster fktest failed; see $W/log/start.err"
    fi
}

up() {
    [ "$(id -u)" -eq 0 ] || fail "needs root (mknod for fake GPUs, slurmd cgroups)"
    install_packages
    local all=1
    alive "$W/munge/munged.pid" || all=0
    alive "$W/run/slurmctld.pid" || all=0
    alive "$W/run/slurmdbd.pid" || all=0
    for n in "${NODES[@]}"; do alive "$W/run/slurmd-$n.pid" || all=0; done
    if [ $all -eq 1 ]; then
        say "already up in $W"
        wait_idle
        return 0
    fi
    # Something is missing: restart the whole set from a clean state.
    down >/dev/null 2>&1 || true
    STARTING=1
    write_configs
    munged --key-file="$W/munge/munge.key" --socket="$W/munge/sock" \
        --pid-file="$W/munge/munged.pid" --log-file="$W/munge/munged.log" \
        --seed-file="$W/munge/munged.seed" --force 2>>"$W/log/start.err" \
        || fail "munged did not start ($(tail -1 "$W/log/start.err"))"
    say "started munged ($(cat "$W/munge/munged.pid"))"
    start_accounting
    slurmctld -c -i 2>>"$W/log/start.err" || fail "slurmctld did not start; see $W/log/slurmctld.log"
    for _ in $(seq 1 50); do alive "$W/run/slurmctld.pid" && break; sleep 0.1; done
    alive "$W/run/slurmctld.pid" || fail "slurmctld exited; see $W/log/slurmctld.log"
    say "started slurmctld ($(cat "$W/run/slurmctld.pid")) on port $CTLD_PORT"
    for n in "${NODES[@]}"; do
        slurmd -N "$n" 2>>"$W/log/start.err" || fail "slurmd $n did not start; see $W/log/slurmd-$n.log"
        for _ in $(seq 1 50); do alive "$W/run/slurmd-$n.pid" && break; sleep 0.1; done
        say "started slurmd $n ($(cat "$W/run/slurmd-$n.pid" 2>/dev/null || echo '?'))"
    done
    wait_idle
    STARTING=0
    say "up: $W (SLURM_CONF=$W/slurm.conf, fk-agentd config $W/fk-agentd.toml)"
}

case "$cmd" in
    up) up ;;
    down)
        down
        say "down: $W"
        ;;
    env) echo "export SLURM_CONF=$W/slurm.conf" ;;
    *) usage ;;
esac
