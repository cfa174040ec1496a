#!/bin/bash
# make stress: the four stress figures of Docs/Reliability.md ("Figures after
# the fixes"), measured on this machine. Not a test suite: each part prints
# what it measured and fails when an invariant broke.
#
#   scripts/stress.sh [send|churn|links|fuzz|all]
#
# Environment: PROBE (default .build/release/reconcile-probe, built by
# `make stress`), THREADS/MESSAGES/CAPACITY (send), CHURN_SECONDS (churn),
# LINK_CHANGES/LINK_SECONDS (links: stop at whichever comes first),
# FUZZ_SECONDS (fuzz). Run it alone on the machine: the figures are rates.
set -euo pipefail
cd "$(dirname "$0")/.."
probe=${PROBE:-.build/release/reconcile-probe}
what=${1:-all}

send() {
    "$probe" stress-send "${THREADS:-8}" "${MESSAGES:-20000}" "${CAPACITY:-64}"
}

churn() {
    "$probe" stress-churn "${CHURN_SECONDS:-60}"
}

# A veth pair in a private network namespace, veth0 flapped down/up with
# `ip -batch` while the probe follows it with the kernel backend; then the
# probe's last reported state is compared with the kernel's (`ip -j`), twice:
# after the flaps (the kernel flushed the default route on down) and after
# the default route is added back.
links() {
    if [ "$(id -u)" != 0 ]; then echo "stress links needs root (network namespaces)" >&2; return 1; fi
    local out
    out=$(mktemp -d)
    trap 'rm -rf "${out:-}"; trap - RETURN' RETURN
    unshare -n /bin/bash -c '
        set -euo pipefail
        probe=$1 out=$2 changes=$3 seconds=$4
        ip link set lo up
        ip link add veth0 type veth peer name veth1
        ip link set veth1 up
        ip link set veth0 up
        ip addr add 10.9.0.2/24 dev veth0
        ip route add default via 10.9.0.1 dev veth0
        "$probe" connectivity --backend kernel >"$out/probe.log" 2>&1 &
        pid=$!
        trap "kill $pid 2>/dev/null || true" EXIT
        for _ in $(seq 50); do grep -q "^state=" "$out/probe.log" && break; sleep 0.1; done
        chunk=2000
        for _ in $(seq $((chunk / 2))); do printf "link set veth0 down\nlink set veth0 up\n"; done >"$out/batch"
        done_changes=0
        start=$(date +%s%N)
        end=$(( $(date +%s) + seconds ))
        while [ "$done_changes" -lt "$changes" ] && [ "$(date +%s)" -lt "$end" ]; do
            ip -batch "$out/batch"
            done_changes=$((done_changes + chunk))
        done
        elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
        echo "stress-links: $done_changes link changes (veth0 down/up) in ${elapsed_ms} ms"

        # Waits until the probe has printed nothing new for 2 s (at most 60 s).
        quiet() {
            local last=-1 now n=0
            while [ $n -lt 60 ]; do
                now=$(wc -l <"$out/probe.log")
                [ "$now" = "$last" ] && return 0
                last=$now; sleep 2; n=$((n + 2))
            done
            echo "stress-links: the probe never went quiet" >&2; return 1
        }
        # Compares the last state line the probe printed with the kernel tables.
        check() {
            local label=$1 line truth_default truth_addrs truth_ifaces
            line=$(grep "^state=" "$out/probe.log" | tail -1)
            truth_default=false
            if [ -n "$(ip -j route show default | jq -r ".[]")$(ip -j -6 route show default | jq -r ".[]")" ]; then truth_default=true; fi
            truth_addrs=$(ip -j addr show | jq -r ".[] | select(.ifname != \"lo\") | .addr_info[] | \"\(.local)/\(.prefixlen)\"" | sort | tr "\n" "," )
            truth_ifaces=$(ip -j link show | jq -r ".[] | select(.ifname != \"lo\") | .ifname" | sort | tr "\n" ",")
            local got_default got_online got_addrs got_ifaces
            got_default=$(sed -n "s/.* default=\([a-z?]*\) .*/\1/p" <<<"$line")
            got_online=$(sed -n "s/.* online=\([a-z]*\) .*/\1/p" <<<"$line")
            got_addrs=$(sed -n "s/.* addrs=//p" <<<"$line" | tr "," "\n" | grep -v "^$" | sort | tr "\n" ",")
            got_ifaces=$(sed -n "s/.* ifaces=\([^ ]*\) .*/\1/p" <<<"$line" | tr "," "\n" | cut -d: -f1 | sort | tr "\n" ",")
            echo "stress-links: $label: probe: $line"
            echo "stress-links: $label: kernel: default route $truth_default, addresses $truth_addrs interfaces $truth_ifaces"
            if [ "$got_default" = "$truth_default" ] && [ "$got_online" = "$truth_default" ] \
                && [ "$got_addrs" = "$truth_addrs" ] && [ "$got_ifaces" = "$truth_ifaces" ]; then
                echo "stress-links: $label: the probe state equals the kernel tables"
            else
                echo "stress-links: $label: MISMATCH (default $got_default, online $got_online, addresses $got_addrs, interfaces $got_ifaces)"
                return 1
            fi
        }
        quiet
        check "after the flaps"
        ip route add default via 10.9.0.1 dev veth0
        quiet
        check "default route added back"
        echo "stress-links: probe printed $(grep -c "^state=" "$out/probe.log") states, $(grep -c "^failed" "$out/probe.log" || true) failures: $(grep "^failed" "$out/probe.log" | sort | uniq -c | head -3 | tr -s " " | tr "\n" ";" || true)"
    ' stress-links "$(realpath "$probe")" "$out" "${LINK_CHANGES:-260000}" "${LINK_SECONDS:-120}"
}

fuzz() {
    make --no-print-directory .build/fuzz-netlink
    mkdir -p .build/fuzz-corpus
    local log
    log=$(mktemp)
    trap 'rm -f "${log:-}"; trap - RETURN' RETURN
    if .build/fuzz-netlink -max_total_time="${FUZZ_SECONDS:-180}" -max_len=4096 -print_final_stats=1 \
        .build/fuzz-corpus Fuzz/netlink/corpus >"$log" 2>&1; then
        echo "stress-fuzz: $(grep -o "Done [0-9]* runs in [0-9]* second(s)" "$log" | tail -1), $(grep -o "corp: [0-9]*" "$log" | tail -1) inputs, no crash"
    else
        tail -40 "$log"; echo "stress-fuzz: CRASH (libFuzzer log above)"; return 1
    fi
}

case $what in
    send) send ;;
    churn) churn ;;
    links) links ;;
    fuzz) fuzz ;;
    all) send; churn; links; fuzz ;;
    *) echo "usage: scripts/stress.sh [send|churn|links|fuzz|all]" >&2; exit 2 ;;
esac
