#!/bin/sh
# Runs COMMAND with a private system bus, ready for systemd-networkd.
# Use inside a private network and mount namespace:
#   unshare -n -m --propagation private scripts/networkd-sandbox.sh COMMAND...
# Then, from outside: nsenter -t PID -n -m scripts/networkd-sandbox.sh --start-networkd
# Other commands (same way): --stop-networkd, --kill-networkd (SIGKILL),
# --wait-networkd, --networkd-pid, --kill-bus (SIGKILL the dbus-daemon),
# --start-bus (again, after --kill-bus), --busctl ARGS..., --cleanup.
set -eu
bus=/run/systemd/testbus
export DBUS_SYSTEM_BUS_ADDRESS=unix:path=$bus/system_bus_socket

start_bus() {
    dbus-daemon --config-file=$bus/bus.conf --fork --nopidfile --print-pid=3 3>$bus/dbus.pid </dev/null >/dev/null 2>&1
}

# Waits (at most 10 s) until process $1 is gone; it is our child or a daemon
# we started, so it is reaped by its parent or by init.
wait_gone() {
    for _ in $(seq 200); do
        kill -0 "$1" 2>/dev/null || return 0
        # A zombie counts as gone.
        [ "$(cut -d' ' -f3 /proc/"$1"/stat 2>/dev/null)" = Z ] && return 0
        sleep 0.05
    done
    return 1
}

case "${1:-}" in
--start-bus)
    # The bus again, after --kill-bus (same socket path and policy).
    start_bus
    exit 0 ;;
--kill-bus)
    # SIGKILL the private dbus-daemon, by its PID: every client sees its
    # connection hang up; the socket file stays behind (connects are refused).
    pid=$(cat $bus/dbus.pid)
    kill -KILL "$pid"
    wait_gone "$pid"
    exit 0 ;;
--kill-networkd)
    # SIGKILL networkd, by its PID (no clean shutdown).
    pid=$(cat $bus/networkd.pid)
    kill -KILL "$pid"
    wait_gone "$pid"
    exit 0 ;;
--networkd-pid)
    cat $bus/networkd.pid
    exit 0 ;;
--start-networkd)
    /lib/systemd/systemd-networkd </dev/null >$bus/networkd.log 2>&1 &
    echo $! >$bus/networkd.pid
    exit 0 ;;
--stop-networkd)
    kill "$(cat $bus/networkd.pid)"
    while kill -0 "$(cat $bus/networkd.pid)" 2>/dev/null; do sleep 0.05; done
    exit 0 ;;
--wait-networkd)
    # Until networkd owns its name (at most 10 s).
    for _ in $(seq 200); do
        busctl --address="$DBUS_SYSTEM_BUS_ADDRESS" call org.freedesktop.DBus /org/freedesktop/DBus \
            org.freedesktop.DBus NameHasOwner s org.freedesktop.network1 2>/dev/null | grep -q true && exit 0
        sleep 0.05
    done
    exit 1 ;;
--cleanup)
    # Daemons must not outlive the test (nor hold its output pipes).
    for f in $bus/networkd.pid $bus/dbus.pid; do
        [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
    done
    exit 0 ;;
--busctl)
    shift
    exec busctl --address="$DBUS_SYSTEM_BUS_ADDRESS" "$@" ;;
esac

mkdir -p /run/systemd
mount -t tmpfs -o mode=0755 tmpfs /run/systemd
# Read-only sysfs: links are not left "pending udev" without udevd.
mount -t sysfs -o ro sysfs /sys
mkdir -p $bus /run/systemd/network
cat >$bus/bus.conf <<CONF
<busconfig><type>system</type>
  <listen>unix:path=$bus/system_bus_socket</listen>
  <auth>EXTERNAL</auth>
  <policy context="default"><allow user="*"/><allow own="*"/>
    <allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/>
  </policy></busconfig>
CONF
start_bus
ip link set lo up
exec "$@"
