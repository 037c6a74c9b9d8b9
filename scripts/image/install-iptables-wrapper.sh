#!/bin/sh
# Puts iptables-wrapper.sh (beside this script) first in line for iptables, ip6tables and their
# -save/-restore, so the image's own iptables commands use the node's back end (the wrapper
# switches the alternatives at its first call). Idempotent. The Dockerfile's runtime step.
set -eu
here=$(dirname "$0")
install -m 0755 "$here/iptables-wrapper.sh" /usr/sbin/iptables-wrapper
for family in iptables ip6tables; do
  update-alternatives --quiet --install "/usr/sbin/$family" "$family" /usr/sbin/iptables-wrapper 100 \
    --slave "/usr/sbin/$family-restore" "$family-restore" /usr/sbin/iptables-wrapper \
    --slave "/usr/sbin/$family-save" "$family-save" /usr/sbin/iptables-wrapper
done
echo "iptables: $(readlink /etc/alternatives/iptables), ip6tables: $(readlink /etc/alternatives/ip6tables)"
