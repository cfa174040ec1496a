#!/bin/sh
# Runs systemd (the machine's own, 252 here) as PID 1 of a private namespace
# with a Type=notify unit around `reconcile-probe lifecycle unit`, and
# measures what the manager does with the daemon's notifications:
#   - a slow reload (ExecReload=kill -HUP $MAINPID, a 1.5 s reload task):
#     the unit's ActiveState/SubState every 100 ms, and when `systemctl
#     reload` returned; the same with an ExecReload= that sleeps 0.2 s after
#     the kill, and a daemon without RELOADING=1 (the control);
#   - `systemctl restart`: the listening socket kept in the fd store comes
#     back to the next instance (same inode);
#   - `systemctl stop` with a 2 s shutdown against TimeoutStopSec=1s while
#     the daemon sends EXTEND_TIMEOUT_USEC: how long it took and Result=;
#   - the fd store's FDSTOREREMOVE=1: a daemon stores `web` and `keep`, is
#     restarted, removes `web`, is restarted again: which names came back
#     each time (`cycle ` lines).
# Prints the results as `key value` lines on stdout; `skip: <reason>` when
# the machine refuses (not root, no unshare, no systemd). Removes the
# cgroups systemd made in the host's hierarchies (there is no cgroup
# namespace) and ends the namespace by the pid of the unshare it started.
#
# usage: systemd-namespace-test.sh PROBE
set -eu
probe=$1
[ "$(id -u)" = 0 ] || { echo "skip: not root"; exit 0; }
[ -x /lib/systemd/systemd ] || { echo "skip: no /lib/systemd/systemd"; exit 0; }
command -v unshare >/dev/null || { echo "skip: no unshare"; exit 0; }
work=$(mktemp -d "${TMPDIR:-/tmp}/reconcile-systemd-XXXXXX")
mkdir -p "$work/units" "$work/empty" "$work/out"

cat > "$work/units/test.target" <<EOF
[Unit]
Description=Reconcile lifecycle test
Wants=driver.service
EOF

cat > "$work/units/life.service" <<EOF
[Unit]
DefaultDependencies=no

[Service]
Type=notify
ExecStart=$probe lifecycle unit $work/out/life.sock 2000 --reload-ms 1500 --grace 8000
ExecReload=/bin/kill -HUP \$MAINPID
TimeoutStopSec=1s
FileDescriptorStoreMax=4
StandardOutput=append:$work/out/life.log
StandardError=append:$work/out/life.log
EOF

# The same daemon with an ExecReload= that waits a moment after the signal,
# so RELOADING=1 reaches the manager before the reload command has exited.
cat > "$work/units/life-wait.service" <<EOF
[Unit]
DefaultDependencies=no

[Service]
Type=notify
ExecStart=$probe lifecycle unit $work/out/life-wait.sock 0 --reload-ms 1500
ExecReload=/bin/sh -c '/bin/kill -HUP \$MAINPID && sleep 0.2'
StandardOutput=append:$work/out/life-wait.log
EOF

# The control: a daemon that takes SIGHUP as a plain signal subscription
# (no RELOADING=1, no READY=1 after it).
cat > "$work/units/plain.service" <<EOF
[Unit]
DefaultDependencies=no

[Service]
Type=notify
ExecStart=$probe daemon
ExecReload=/bin/kill -HUP \$MAINPID
StandardOutput=append:$work/out/plain.log
EOF

# Stores web and keep; after a restart removes web (FDSTOREREMOVE=1).
cat > "$work/units/fdcycle.service" <<EOF
[Unit]
DefaultDependencies=no

[Service]
Type=notify
ExecStart=$probe fdstore-cycle $work/out/cycle
FileDescriptorStoreMax=4
StandardOutput=append:$work/out/fdcycle.log
StandardError=append:$work/out/fdcycle.log
EOF

cat > "$work/units/driver.service" <<EOF
[Unit]
DefaultDependencies=no

[Service]
Type=oneshot
ExecStart=/bin/sh $work/driver.sh
StandardOutput=append:$work/out/driver.log
StandardError=append:$work/out/driver.log
EOF

cat > "$work/driver.sh" <<'EOF'
out=$(dirname "$0")/out
r=$out/results
now() { date +%s%N; }
state() { systemctl show -p ActiveState -p SubState -p Result --value life.service | tr '\n' ' '; }
echo "start_begin $(now)" >> $r
systemctl start life.service
echo "start_end $(now)" >> $r
echo "after_start $(state)" >> $r
echo "pid1 $(systemctl show -p MainPID --value life.service)" >> $r
(i=0; while [ $i -lt 25 ]; do echo "state $(now) $(state)" >> $r; sleep 0.1; i=$((i+1)); done) &
poller=$!
sleep 0.2
echo "reload_begin $(now)" >> $r
systemctl reload life.service
echo "reload_end $(now) rc=$?" >> $r
wait $poller
echo "after_reload $(state)" >> $r
systemctl restart life.service
echo "after_restart $(state)" >> $r
echo "pid2 $(systemctl show -p MainPID --value life.service)" >> $r
echo "stop_begin $(now)" >> $r
systemctl stop life.service
echo "stop_end $(now) rc=$?" >> $r
echo "after_stop $(state)" >> $r
systemctl start life-wait.service
echo "wait_reload_begin $(now)" >> $r
systemctl reload life-wait.service
echo "wait_reload_end $(now) rc=$?" >> $r
echo "wait_after_reload $(systemctl show -p ActiveState -p SubState --value life-wait.service | tr '\n' ' ')" >> $r
systemctl stop life-wait.service
systemctl start plain.service
echo "plain_reload_begin $(now)" >> $r
systemctl reload plain.service
echo "plain_reload_end $(now) rc=$?" >> $r
echo "plain_after_reload $(systemctl show -p ActiveState -p SubState --value plain.service | tr '\n' ' ')" >> $r
systemctl stop plain.service
systemctl start fdcycle.service
systemctl restart fdcycle.service
systemctl restart fdcycle.service
echo "fdcycle_after $(systemctl show -p ActiveState -p SubState --value fdcycle.service | tr '\n' ' ')" >> $r
systemctl stop fdcycle.service
echo "done" >> $r
systemctl --no-block exit 0 2>/dev/null || systemctl --no-block poweroff -f
EOF

cat > "$work/boot.sh" <<EOF
set -e
mount --make-rprivate /
mount --bind $work/units /etc/systemd/system
mount --bind $work/empty /lib/systemd/system
mount --bind $work/empty /lib/systemd/system-generators
mount -t tmpfs tmpfs /run
exec env container=reconcile-test /lib/systemd/systemd --system --unit=test.target
EOF

# The cgroups that exist now: the ones after the run that are not among them are ours.
cgroups_before=$(find /sys/fs/cgroup/systemd /sys/fs/cgroup/unified -mindepth 1 -type d 2>/dev/null | sort)
unshare --mount --pid --fork --mount-proc --net --uts --ipc --kill-child sh "$work/boot.sh" \
    > "$work/out/pid1.log" 2>&1 &
ns=$!
i=0
while [ $i -lt 300 ] && ! grep -q '^done' "$work/out/results" 2>/dev/null; do
    if ! kill -0 $ns 2>/dev/null; then break; fi
    sleep 0.1
    i=$((i+1))
done
if grep -q '^done' "$work/out/results" 2>/dev/null; then
    # PID 1 exits by itself (systemctl exit); give it a moment, then end it.
    j=0
    while [ $j -lt 30 ] && kill -0 $ns 2>/dev/null; do sleep 0.1; j=$((j+1)); done
fi
kill $ns 2>/dev/null || true
wait $ns 2>/dev/null || true
cgroups_after=$(find /sys/fs/cgroup/systemd /sys/fs/cgroup/unified -mindepth 1 -type d 2>/dev/null | sort)
echo "$cgroups_after" | grep -vxF "$cgroups_before" | sort -r | while read -r d; do
    [ -n "$d" ] && rmdir "$d" 2>/dev/null || true
done
left=$(find /sys/fs/cgroup/systemd /sys/fs/cgroup/unified -mindepth 1 -type d 2>/dev/null | sort | grep -vxF "$cgroups_before" | wc -l)

if [ ! -s "$work/out/results" ]; then
    echo "skip: systemd did not run in the namespace: $(tail -3 "$work/out/pid1.log" | tr '\n' ' ')"
else
    cat "$work/out/results"
    sed 's/^/log /' "$work/out/life.log" 2>/dev/null || true
    sed 's/^/cycle /' "$work/out/fdcycle.log" 2>/dev/null || true
fi
echo "cgroups_left $left"
rm -rf "$work"
