#!/bin/sh
# make demo-netns: the indicator in a private network namespace, watching a
# veth pair scripted through down -> no-carrier -> routable -> address removed.
set -eu
indicator=${1:-.build/debug/connectivity-indicator}
if [ "$(id -u)" != 0 ]; then echo "demo-netns needs root (network namespaces)" >&2; exit 1; fi
exec unshare -n /bin/sh -c '
    indicator=$0
    ip link add veth0 type veth peer name veth1
    ip link set veth0 addrgenmode none
    "$indicator" --backend kernel --include veth0 --format text &
    pid=$!
    trap "kill $pid 2>/dev/null" EXIT
    step() { sleep 1.5; echo "  # $1" >&2; shift; "$@"; }
    step "veth0 up, peer down: no carrier"      ip link set veth0 up
    step "peer up: carrier"                     ip link set veth1 up
    step "address: routable"                    ip addr add 192.168.77.1/24 dev veth0
    step "default route: online"                ip route add default via 192.168.77.2
    step "address removed: carrier, offline"    ip addr del 192.168.77.1/24 dev veth0
    step "veth0 down"                           ip link set veth0 down
    sleep 1.5
' "$indicator"
