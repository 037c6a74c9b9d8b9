#!/bin/sh
# Fails unless every tool the daemon runs is on PATH: both iptables back ends in both
# families (with their save/restore), nft, ipset, conntrack, modprobe. The Dockerfile's last step.
set -eu
status=0
for tool in iptables-legacy iptables-legacy-save iptables-legacy-restore \
            ip6tables-legacy ip6tables-legacy-save ip6tables-legacy-restore \
            iptables-nft iptables-nft-save iptables-nft-restore \
            ip6tables-nft ip6tables-nft-save ip6tables-nft-restore \
            nft ipset conntrack modprobe; do
  if command -v "$tool" >/dev/null 2>&1; then
    echo "ok      $tool"
  else
    echo "MISSING $tool"
    status=1
  fi
done
exit $status
