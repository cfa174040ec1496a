#!/bin/sh
# networkd's links as JSON (`networkctl list --json=short`: OperationalState,
# CarrierState, AddressState per link) inside a networkd-sandbox.sh namespace:
#   nsenter -t PID -n -m scripts/networkd-links.sh
set -eu
export DBUS_SYSTEM_BUS_ADDRESS=unix:path=/run/systemd/testbus/system_bus_socket
exec networkctl list --json=short
