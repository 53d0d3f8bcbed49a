#!/usr/bin/env bash
# A reader on another host, as far as the kernel can tell: a network namespace of its
# own joined to this one by a veth pair, optionally shaped with tc (a rate each way, by
# netem or tbf; a delay, by netem where the kernel has it). Servers listen on $NETNS_HOST_IP; readers run inside with
# `ip netns exec $NETNS_NAME CMD` and reach them over the pair, not the loopback: the
# node sees a peer address that is not its own (so `--sendfile auto` sends files) and the
# bytes cross a device, softirqs and all.
#
# As a library (compare.sh --veth):  source bench/netns.sh; netns_up [RATE [DELAY]]; ...; netns_down
# From the shell:                   bench/netns.sh [--rate 10gbit] [--delay 100us] -- CMD...
#   runs CMD inside the namespace with NETNS_HOST_IP set, then removes the namespace.
# Needs root (ip netns, ip link, tc: Debian's iproute2). One pair per process, its
# addresses 10.77.N.1 (here) and 10.77.N.2 (inside), N from the process id.

netns_up() { # [RATE] [DELAY]
  local n=$(( $$ % 250 + 1 ))
  NETNS_NAME="granary-reader-$$"
  NETNS_HOST_IP="10.77.$n.1"
  NETNS_READER_IP="10.77.$n.2"
  local host_if="gr$$h" reader_if="gr$$r"
  ip netns add "$NETNS_NAME"
  ip link add "$host_if" type veth peer name "$reader_if"
  ip link set "$reader_if" netns "$NETNS_NAME"
  ip addr add "$NETNS_HOST_IP/30" dev "$host_if"
  ip link set "$host_if" up
  ip netns exec "$NETNS_NAME" ip addr add "$NETNS_READER_IP/30" dev "$reader_if"
  ip netns exec "$NETNS_NAME" ip link set "$reader_if" up
  ip netns exec "$NETNS_NAME" ip link set lo up
  NETNS_HOST_IF=$host_if
  # A delay needs netem (the kernel's sch_netem); a rate alone takes tbf where netem is
  # missing (this project's build machine has tbf only).
  local shape=() kind=netem
  [ -n "${2:-}" ] && shape+=(delay "$2")
  [ -n "${1:-}" ] && shape+=(rate "$1")
  if [ -n "${1:-}" ] && [ -z "${2:-}" ] && ! tc qdisc add dev "$host_if" root netem rate "$1" 2>/dev/null; then
    kind=tbf shape=(rate "$1" burst 256kb latency 50ms)
  elif [ ${#shape[@]} -gt 0 ]; then
    tc qdisc del dev "$host_if" root 2>/dev/null || true
  fi
  if [ ${#shape[@]} -gt 0 ]; then
    tc qdisc replace dev "$host_if" root "$kind" "${shape[@]}"
    ip netns exec "$NETNS_NAME" tc qdisc replace dev "$reader_if" root "$kind" "${shape[@]}"
  fi
  export NETNS_NAME NETNS_HOST_IP NETNS_READER_IP NETNS_HOST_IF
}

netns_down() {
  [ -n "${NETNS_HOST_IF:-}" ] && ip link del "$NETNS_HOST_IF" 2>/dev/null
  [ -n "${NETNS_NAME:-}" ] && ip netns del "$NETNS_NAME" 2>/dev/null
  NETNS_NAME=""
  return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  rate="" delay=""
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=$2; shift 2 ;;
      --delay) delay=$2; shift 2 ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || { echo "usage: $0 [--rate R] [--delay D] -- CMD..." >&2; exit 2; }
  trap netns_down EXIT
  netns_up "$rate" "$delay"
  ip netns exec "$NETNS_NAME" env NETNS_HOST_IP="$NETNS_HOST_IP" "$@"
fi
