#!/bin/sh
# Installs the daemon under ROOT as /usr/local/bin/kube-proxy-rs, with /usr/local/bin/kube-proxy
# pointing at it so kubeadm's command line (/usr/local/bin/kube-proxy --config=...) works
# unchanged. Usage: install-binary.sh BINARY ROOT
set -eu
if [ $# -ne 2 ]; then
  echo "usage: $0 BINARY ROOT" >&2
  exit 64
fi
binary=$1
root=$2
install -D -m 0755 "$binary" "$root/usr/local/bin/kube-proxy-rs"
ln -sf kube-proxy-rs "$root/usr/local/bin/kube-proxy"
