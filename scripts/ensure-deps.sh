#!/bin/sh
# Installs the Debian packages the build and the tests need, only when missing.
set -eu
missing=""
need() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed" || missing="$missing $1"; }
need libsystemd-dev
need pkg-config
need iproute2
need dbus-daemon
need dbus-bin
need systemd
need jq
need python3-dbus
need python3-gi
need libglib2.0-bin
need strace
need binutils
# The IO tests: python3 clients, setpriv (a peer running as nobody).
need python3
need util-linux
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "missing packages:$missing (run as root or install them)" >&2
    exit 1
fi
echo "installing:$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends $missing >/dev/null
