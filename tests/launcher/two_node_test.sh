#!/usr/bin/env bash
# Two "nodes" on one machine: two network namespaces joined by a veth pair
# (10.77.0.1/24 and 10.77.0.2/24), COMMAND run by bash in each with NODE_RANK
# (0 or 1) and NODE0_ADDR (10.77.0.1) set: one launcher per node. Passes
# when both exit 0.
#
#   two_node_test.sh COMMAND
#
# Where namespaces cannot be made (not root, no CAP_SYS_ADMIN, no iproute2)
# it prints "SKIPPED: <reason>" and exits 0. The namespaces are always removed.
set -u

if [ $# -ne 1 ]; then
  echo "usage: $0 COMMAND" >&2
  exit 2
fi
command=$1

skip() {
  echo "SKIPPED: $*"
  exit 0
}

command -v ip >/dev/null 2>&1 || skip "iproute2 is not installed (apt-get install iproute2)"
[ "$(id -u)" = 0 ] || skip "creating network namespaces needs root"

# Names unique to this run, so concurrent runs do not collide (interface
# names must stay under 16 characters).
id=$$
ns0=ls-n0-$id
ns1=ls-n1-$id
veth0=lsv0-$id
veth1=lsv1-$id
logs=$(mktemp -d /tmp/lockstep-two-node-XXXXXX)

cleanup() {
  ip netns del "$ns0" 2>/dev/null
  ip netns del "$ns1" 2>/dev/null
  ip link del "$veth0" 2>/dev/null
  rm -rf "$logs"
}
trap cleanup EXIT

ip netns add "$ns0" 2>"$logs/err" || skip "cannot create a network namespace: $(cat "$logs/err")"
ip netns add "$ns1" 2>"$logs/err" || skip "cannot create a network namespace: $(cat "$logs/err")"
ip link add "$veth0" type veth peer name "$veth1" 2>"$logs/err" ||
  skip "cannot create a veth pair: $(cat "$logs/err")"

set -e
ip link set "$veth0" netns "$ns0"
ip link set "$veth1" netns "$ns1"
ip -n "$ns0" addr add 10.77.0.1/24 dev "$veth0"
ip -n "$ns1" addr add 10.77.0.2/24 dev "$veth1"
for ns in "$ns0" "$ns1"; do ip -n "$ns" link set lo up; done
ip -n "$ns0" link set "$veth0" up
ip -n "$ns1" link set "$veth1" up
set +e

# Every node's launcher must share the store token.
LOCKSTEP_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
export LOCKSTEP_TOKEN NODE0_ADDR=10.77.0.1

NODE_RANK=0 timeout -k 5 90 ip netns exec "$ns0" bash -c "$command" >"$logs/node0" 2>&1 &
pid0=$!
NODE_RANK=1 timeout -k 5 90 ip netns exec "$ns1" bash -c "$command" >"$logs/node1" 2>&1 &
pid1=$!
wait "$pid0"
rc0=$?
wait "$pid1"
rc1=$?

sed 's/^/node 0: /' "$logs/node0"
sed 's/^/node 1: /' "$logs/node1"
echo "node 0 exit $rc0, node 1 exit $rc1"
[ "$rc0" = 0 ] && [ "$rc1" = 0 ]
