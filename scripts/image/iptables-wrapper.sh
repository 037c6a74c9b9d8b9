#!/bin/sh
# The image's iptables, ip6tables and their -save/-restore until the first call: picks the back
# end the node's rules are in, as the daemon does and as upstream's image wrapper does (the
# back end holding kubelet's KUBE-IPTABLES-HINT chain, else kubelet's KUBE-KUBELET-CANARY, else
# an earlier kube-proxy's KUBE-PROXY-CANARY; with none, legacy only if legacy has rules and
# nf_tables has no iptables table), points the alternatives at it and runs the real tool. So
# `kubectl exec ... iptables-save` in the pod shows the rules the daemon wrote.
set -eu
has_chain() { # BACKEND CHAIN: the chain exists in mangle, IPv4 or IPv6
  "iptables-$1" -w 5 -t mangle -S "$2" >/dev/null 2>&1 || "ip6tables-$1" -w 5 -t mangle -S "$2" >/dev/null 2>&1
}
backend=""
for chain in KUBE-IPTABLES-HINT KUBE-KUBELET-CANARY KUBE-PROXY-CANARY; do
  for candidate in legacy nft; do
    if [ -z "$backend" ] && has_chain "$candidate" "$chain"; then backend=$candidate; fi
  done
done
if [ -z "$backend" ]; then
  backend=nft
  if iptables-legacy-save 2>/dev/null | grep -q '^-A ' &&
     ! iptables-nft-save 2>/dev/null | grep -q '^\*'; then
    backend=legacy
  fi
fi
# Once: later calls go straight to the real tool (if the image is read-only, every call asks).
update-alternatives --quiet --set iptables "/usr/sbin/iptables-$backend" >/dev/null 2>&1 || true
update-alternatives --quiet --set ip6tables "/usr/sbin/ip6tables-$backend" >/dev/null 2>&1 || true
name=$(basename "$0")
family=${name%%-*}
case "$name" in
  *-*) job=-${name#*-} ;;
  *) job="" ;;
esac
exec "/usr/sbin/$family-$backend$job" "$@"
