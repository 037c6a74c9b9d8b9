#!/usr/bin/env bash
# Runs kube-proxy-rs against a local test API server holding examples/demo.yaml, shows what it
# would program, scales a service and shows the change being followed, then cleans up.
# Needs no root and no cluster: it only talks HTTP on 127.0.0.1.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== building"
cargo build --workspace --bins --quiet
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

./target/debug/test-apiserver --listen 127.0.0.1:0 --kubeconfig-out "$work/kubeconfig" examples/demo.yaml >"$work/api.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/kubeconfig" ] && break; sleep 0.1; done
server=$(sed -n 's/^ *server: http:\/\///p' "$work/kubeconfig")
echo "== test API server on http://$server (objects from examples/demo.yaml)"

./target/debug/kube-proxy-rs --dry-run --healthz-bind-address=127.0.0.1:10256 --metrics-bind-address=127.0.0.1:10249 --kubeconfig "$work/kubeconfig" --hostname-override node-a --v=2 2>"$work/proxy.log" &
pids+=($!)

wait_for() {
  for _ in $(seq 200); do grep -q -- "$1" "$work/proxy.log" && return 0; sleep 0.1; done
  echo "timed out waiting for: $1"; cat "$work/proxy.log"; exit 1
}
wait_for '"Synced proxy rules"'
echo "== kube-proxy-rs started; what it would program:"
grep -E 'Using|Caches are synced|Would program' "$work/proxy.log"

echo "== scaling demo/web to three endpoints"
body='{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"web-1","namespace":"demo","labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4","ports":[{"name":"http","port":8080,"protocol":"TCP"}],"endpoints":[{"addresses":["10.244.1.11"],"conditions":{"ready":true},"nodeName":"node-a"},{"addresses":["10.244.1.12"],"conditions":{"ready":true},"nodeName":"node-a"},{"addresses":["10.244.1.13"],"conditions":{"ready":true},"nodeName":"node-a"}]}'
exec 3<>"/dev/tcp/${server%:*}/${server##*:}"
printf 'PUT /apis/discovery.k8s.io/v1/namespaces/demo/endpointslices/web-1 HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
  "$server" "${#body}" "$body" >&3
cat <&3 >/dev/null
exec 3<&-
wait_for '10.244.1.13:8080'
grep -- '10.244.1.13:8080' "$work/proxy.log"
echo "== done; stopping"
