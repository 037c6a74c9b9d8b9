#!/usr/bin/env bash
# kube-proxy-rs for real, without a cluster: network namespaces for a node, a client and three
# pods (each a tiny web server answering its name), the test API server holding a Service and
# its EndpointSlice, and the daemon in the node's namespace programming that namespace's
# kernel. Connections to the ClusterIP and the NodePort show which pod answered; then the
# Service is scaled down and deleted and the daemon follows. Everything is removed at the end,
# on Ctrl-C too. Nothing touches your own network namespace.
#
#   sudo bash scripts/sandbox.sh                     # iptables mode
#   sudo SANDBOX_MODE=ipvs bash scripts/sandbox.sh   # IPVS (falls back to iptables without it)
#   sudo SANDBOX_MODE=nftables bash scripts/sandbox.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "The sandbox must run as root: it creates network namespaces and programs iptables" >&2
  echo "inside them (never in your own). Run: sudo bash scripts/sandbox.sh" >&2
  exit 1
fi
mode=${SANDBOX_MODE:-iptables}

# Tools: iproute2 (namespaces), iptables, nft, busybox (the pods' web servers), curl (the client).
missing=()
for tool in ip:iproute2 iptables:iptables nft:nftables busybox:busybox-static curl:curl ipset:ipset; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool##*:}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install a Rust toolchain first (https://rustup.rs)" >&2
  exit 1
fi

echo "== building kube-proxy-rs and the test API server"
cargo build --workspace --bins --quiet

prefix="kprs-sandbox-$$"
node="$prefix-node"
client="$prefix-client"
pods=(pod-1 pod-2 pod-3)
work=$(mktemp -d)
pids=()

cleanup() {
  set +e
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  for ns in $(ip netns list | awk '{print $1}' | grep "^$prefix-"); do ip netns del "$ns"; done
  rm -rf "$work"
  echo "== cleaned up: namespaces $prefix-* removed, processes stopped"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

in_ns() { ns=$1; shift; ip netns exec "$ns" "$@"; }

# Connects namespaces $1 and $3 with a veth pair named $2 / $4; neither end ever sits in the
# host's namespace.
veth() {
  ip -n "$1" link add "$2" type veth peer name "kp$$t"
  ip -n "$1" link set "kp$$t" netns "$3"
  ip -n "$3" link set "kp$$t" name "$4"
  ip -n "$1" link set "$2" up
  ip -n "$3" link set "$4" up
}

echo "== network namespaces: $node (192.168.100.2), $client (192.168.100.1), pods 10.244.1.11-13"
for ns in "$node" "$client"; do
  ip netns add "$ns"
  ip -n "$ns" link set lo up
done
in_ns "$node" sysctl -q -w net.ipv4.ip_forward=1
veth "$node" eth0 "$client" eth0
ip -n "$node" addr add 192.168.100.2/24 dev eth0
ip -n "$client" addr add 192.168.100.1/24 dev eth0
ip -n "$client" route add default via 192.168.100.2
# Locally sent packets need a route before nat OUTPUT sees them; it points at the client.
ip -n "$node" route add default via 192.168.100.1
for i in 1 2 3; do
  pod="$prefix-${pods[$((i - 1))]}"
  ip="10.244.1.1$i"
  ip netns add "$pod"
  ip -n "$pod" link set lo up
  veth "$node" "veth$i" "$pod" eth0
  ip -n "$node" addr add 10.244.0.1/32 dev "veth$i"
  ip -n "$node" route add "$ip/32" dev "veth$i"
  ip -n "$pod" addr add "$ip/32" dev eth0
  ip -n "$pod" route add 10.244.0.1 dev eth0
  ip -n "$pod" route add default via 10.244.0.1
  mkdir -p "$work/${pods[$((i - 1))]}"
  echo "${pods[$((i - 1))]}" >"$work/${pods[$((i - 1))]}/index.html"
  # `ip netns exec` execs the command, so $! is the server itself (kill reaches it).
  ip netns exec "$pod" busybox httpd -f -p 8080 -h "$work/${pods[$((i - 1))]}" &
  pids+=($!)
done

echo "== test API server in $node, holding examples/sandbox.yaml (Service demo/web, 3 endpoints)"
ip netns exec "$node" ./target/debug/test-apiserver --listen 127.0.0.1:0 --kubeconfig-out "$work/kubeconfig" \
  examples/sandbox.yaml >"$work/api.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/kubeconfig" ] && break; sleep 0.1; done
api=$(sed -n 's/^ *server: //p' "$work/kubeconfig")

cat >"$work/config.conf" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: $mode
clusterCIDR: 10.244.0.0/16
clientConnection:
  kubeconfig: $work/kubeconfig
EOF
echo "== kube-proxy-rs in $node, mode: $mode (log: kube-proxy-rs.log lines below)"
ip netns exec "$node" ./target/debug/kube-proxy-rs --config="$work/config.conf" --hostname-override=node-a \
  --v=2 2>"$work/proxy.log" &
pids+=($!)
for _ in $(seq 300); do grep -q '"Synced proxy rules"' "$work/proxy.log" && break; sleep 0.1; done
if ! grep -q '"Synced proxy rules"' "$work/proxy.log"; then
  echo "kube-proxy-rs did not sync; its log:"; cat "$work/proxy.log"; exit 1
fi
grep -E 'Proxier|proxier|Caches are synced' "$work/proxy.log" | sed 's/^/   /'
echo "== kube-proxy-rs is serving"

ask() { in_ns "$client" curl -s --max-time 2 "http://$1/" || echo "(no answer)"; }
show_traffic() {
  for target in 10.96.0.10:80 192.168.100.2:30080; do
    kind=ClusterIP; [ "$target" = 192.168.100.2:30080 ] && kind=NodePort
    for _ in 1 2 3 4 5 6; do printf '   %-9s %-19s -> %s\n' "$kind" "$target" "$(ask "$target")"; done
  done
}
save() {
  if [ "$mode" = nftables ]; then
    in_ns "$node" nft list table ip kube-proxy 2>/dev/null || true
    return
  fi
  # The daemon uses whichever iptables back end the node's rules are in.
  local text
  text=$(in_ns "$node" iptables-nft-save -t nat 2>/dev/null || true)
  grep -q KUBE- <<<"$text" || text=$(in_ns "$node" iptables-legacy-save -t nat 2>/dev/null || true)
  printf '%s\n' "$text"
}
show_rules() {
  if grep -q 'Using ipvs Proxier' "$work/proxy.log"; then
    in_ns "$node" ipvsadm -Ln | sed 's/^/   /'
  elif [ "$mode" = nftables ]; then
    save | grep -E 'chain (service|endpoint|external)-|goto (service|external)-|dnat to|numgen' | sed 's/^/   /'
  else
    save | grep -E '^-A KUBE-(SERVICES|NODEPORTS|EXT|SVC|SEP)' | sed 's/^/   /'
  fi
}
# Waits (30 s at most: a loaded machine can take more than 10) until the client only reaches
# the pods named in $1 (a grep pattern).
wait_for_answers() {
  for _ in $(seq 60); do
    answers=$(for _ in 1 2 3 4 5 6; do ask 10.96.0.10:80; done)
    grep -qvE "^($1)$" <<<"$answers" || return 0
    sleep 0.5
  done
}

echo "== connections from $client: which pod answered"
show_traffic
echo "== what kube-proxy-rs programmed in $node"
show_rules

echo "== scaling demo/web down to pod-1 (the EndpointSlice is updated in the API)"
in_ns "$node" curl -s -o /dev/null -X PUT -H 'Content-Type: application/json' \
  "$api/apis/discovery.k8s.io/v1/namespaces/demo/endpointslices/web-1" --data '{
  "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
  "metadata": {"name": "web-1", "namespace": "demo", "labels": {"kubernetes.io/service-name": "web"}},
  "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
  "endpoints": [{"addresses": ["10.244.1.11"], "conditions": {"ready": true}, "nodeName": "node-a"}]}'
wait_for_answers pod-1
show_traffic
show_rules

echo "== deleting Service demo/web"
deleted=$(in_ns "$node" curl -s -o /dev/null -w '%{http_code}' -X DELETE "$api/api/v1/namespaces/demo/services/web")
[ "$deleted" = 200 ] || echo "   the API server answered the DELETE with $deleted"
# A read that failed (iptables-nft-save racing one of the daemon's transactions prints nothing)
# proves nothing: wait for one that shows our table, without demo/web.
for _ in $(seq 300); do
  rules=$(save)
  grep -qE 'KUBE-SERVICES|table ip kube-proxy' <<<"$rules" && ! grep -q 'demo/web' <<<"$rules" && break
  sleep 0.1
done
for _ in 1 2; do printf '   %-9s %-19s -> %s\n' ClusterIP 10.96.0.10:80 "$(ask 10.96.0.10:80)"; done
left=$(grep -c 'demo/web' <<<"$rules" || true)
echo "   rules left for demo/web: $left"
if [ "$left" != 0 ]; then
  echo "   kube-proxy-rs's last log lines:"; tail -n 20 "$work/proxy.log" | sed 's/^/   /'
  # Whether the daemon heard of the deletion (its view without the Service, a change queued
  # after the last sync) and no sync followed, or never heard of it.
  echo "   now: $(date +%s.%N)"
  echo "   kube-proxy-rs's view of demo/web:"
  in_ns "$node" curl -s --max-time 2 http://127.0.0.1:10249/debug/kube-proxy-rs/services/demo/web | head -c 2000 | sed 's/^/   /'
  echo
  in_ns "$node" curl -s --max-time 2 http://127.0.0.1:10249/metrics | grep -E '^kubeproxy_sync_proxy_rules_((service|endpoint)_changes_(pending|total)|last_(queued_)?timestamp_seconds)' | sed 's/^/   /'
fi
echo "== done"
