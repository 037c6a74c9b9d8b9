#!/bin/sh
# The runtime image's packages: both iptables back ends (the daemon picks the one the node's
# rules are in), nftables (nft, for nftables mode), ipset (IPVS mode), conntrack and kmod
# (modprobe for IPVS modules), CA certificates (the API server's TLS). The Dockerfile runs this on debian:bookworm-slim;
# it is idempotent and does nothing when everything is installed.
set -eu
packages="iptables nftables ipset conntrack kmod ca-certificates"
missing=""
for package in $packages; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing="$missing $package"
done
if [ -z "$missing" ]; then
  echo "runtime packages already installed: $packages"
  exit 0
fi
echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing
rm -rf /var/lib/apt/lists/*
