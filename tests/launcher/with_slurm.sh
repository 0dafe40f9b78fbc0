#!/usr/bin/env bash
# Runs COMMAND inside a single-node Slurm cluster of its own: munged,
# slurmctld and slurmd started as root from Debian's packages (slurm-wlm,
# munge), with a minimal slurm.conf in a temporary directory, on ports of
# their own, so nothing of the machine's configuration is used or changed.
# COMMAND runs with SLURM_CONF pointing at that configuration; this script
# exits with its status. The daemons and the directory are always removed.
#
#   with_slurm.sh COMMAND [ARGS...]
#
# Where that cannot be done (not root, the packages missing, this host's name
# not resolvable) it prints "SKIPPED: <reason>" and exits 0.
set -u

if [ $# -lt 1 ]; then
  echo "usage: $0 COMMAND [ARGS...]" >&2
  exit 2
fi

skip() {
  echo "SKIPPED: $*"
  exit 0
}

[ "$(id -u)" = 0 ] || skip "starting slurmctld, slurmd and munged needs root"
for tool in munged slurmctld slurmd srun sbatch sinfo; do
  PATH=$PATH:/usr/sbin command -v "$tool" >/dev/null 2>&1 ||
    skip "$tool is not installed (apt-get install slurm-wlm munge)"
done
[ -r /etc/munge/munge.key ] || skip "munge has no key (/etc/munge/munge.key); reinstall munge"
node=$(hostname -s)
# Tasks find rank 0 by the step's first node name, as on a real cluster.
getent hosts "$node" >/dev/null || skip "this host's name '$node' does not resolve"
export PATH=$PATH:/usr/sbin

dir=$(mktemp -d /tmp/lockstep-slurm-XXXXXX)
chmod 755 "$dir"
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
  done
  if [ -f "$dir/munged.pid" ]; then
    munged_pid=$(cat "$dir/munged.pid")
    kill "$munged_pid" 2>/dev/null
    # It writes its seed file as it exits: gone first, then the directory.
    for _ in $(seq 50); do kill -0 "$munged_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

fail() {
  echo "with_slurm.sh: $*" >&2
  for log in munged slurmctld slurmd; do
    [ -f "$dir/$log.log" ] && { echo "--- $log.log" >&2; tail -20 "$dir/$log.log" >&2; }
  done
  exit 1
}

# A cluster name and first job id of its own too: tasks derive their store's
# port and token from them, and two clusters started side by side (ctest -j)
# would otherwise both number their first job 1 and meet in one store.
first_job_id=$((1000 + (RANDOM * 32768 + RANDOM) % 60000000))

munged --force --socket="$dir/munge.socket" --key-file=/etc/munge/munge.key \
  --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge.seed" ||
  fail "munged did not start"

mkdir -p "$dir/state" "$dir/spool"
# The node's CPUs as slurmd counts them: nproc answers OMP_NUM_THREADS where a
# user's shell sets it, and slurmctld drains a node with fewer CPUs than that.
write_conf() {
  cat >"$dir/slurm.conf" <<EOF
ClusterName=lockstep-test-$$
FirstJobId=$first_job_id
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
}
export SLURM_CONF=$dir/slurm.conf

running() { ps -o stat= -p "$1" 2>/dev/null | grep -qv Z; }

# Ports of this run's own, drawn below Linux's ephemeral range (where any
# outgoing connection or bind to port 0 may hold one): slurmctld's even,
# slurmd's the odd one after it. Both are drawn again when either daemon finds
# its port taken (by another test's cluster, say).
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "$ephemeral_low" -gt 12000 ] 2>/dev/null || ephemeral_low=32768
stop_daemon() {
  kill "$1" 2>/dev/null
  wait "$1" 2>/dev/null  # gone before the next try (or the cleanup) touches its files
}
started=""
for _ in 1 2 3 4 5; do
  port=$(((ephemeral_low - 10000) / 2 * 2 + (RANDOM % 4990) * 2))
  write_conf
  : >"$dir/slurmctld.log"
  : >"$dir/slurmd.log"
  slurmctld -D -i >>"$dir/slurmctld.log" 2>&1 &
  ctld=$!
  # Up when it says so and has not died a moment later (a taken port ends it
  # at once, with "fatal" in its log; a dead child may linger as a zombie).
  for _ in $(seq 50); do
    grep -q fatal "$dir/slurmctld.log" && break
    running "$ctld" || break
    grep -q "Running as primary controller" "$dir/slurmctld.log" && sleep 0.3 && break
    sleep 0.1
  done
  if ! running "$ctld" || grep -q fatal "$dir/slurmctld.log"; then
    stop_daemon "$ctld"
    grep -q "Address already in use" "$dir/slurmctld.log" || fail "slurmctld did not start"
    continue
  fi
  slurmd -D -N "$node" >>"$dir/slurmd.log" 2>&1 &
  slurmd_pid=$!
  # slurmd binds its port before it says it started; a taken port never lets
  # it start (it retries the bind), so the node would never become idle. One
  # slow to start is waited for below, with the node.
  for _ in $(seq 200); do
    grep -q "Address already in use" "$dir/slurmd.log" && break
    running "$slurmd_pid" || break
    grep -q "slurmd started on" "$dir/slurmd.log" && break
    sleep 0.1
  done
  if running "$slurmd_pid" && ! grep -q "Address already in use" "$dir/slurmd.log"; then
    pids+=("$ctld" "$slurmd_pid")
    started=yes
    break
  fi
  stop_daemon "$slurmd_pid"
  stop_daemon "$ctld"
  grep -q "Address already in use" "$dir/slurmd.log" || fail "slurmd did not start"
done
[ -n "$started" ] || fail "slurmctld's or slurmd's port was taken 5 times"

# Ready when the node is idle; sinfo itself can wait long for a controller
# that is not there, so the wait is bounded by time.
deadline=$((SECONDS + 30))
until [ "$(timeout 5 sinfo -h -n "$node" -o %T 2>/dev/null)" = idle ]; do
  [ $SECONDS -lt $deadline ] || fail "the node did not become idle in 30 s"
  sleep 0.2
done

"$@"
