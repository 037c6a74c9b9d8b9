#!/usr/bin/env bash
# Builds the container image from the project's Dockerfile, unchanged, on a Debian 12 machine
# with no Docker engine and no registry reachable: buildah and podman from Debian's apt, and the
# two base images the Dockerfile names made here from Debian's packages with mmdebstrap:
#   debian:bookworm-slim  minbase bookworm with the slim image's dpkg excludes;
#   rust:1-bookworm       the same plus Debian's rustc-web/cargo-web (bookworm-security) and a C
#                         toolchain, CARGO_HOME=/usr/local/cargo as in the official image.
# The build stage compiles the binary exactly as the Dockerfile says, offline, from the crates
# this machine has already downloaded ($CARGO_HOME/registry, mounted for the RUN steps only).
# The runtime stage's apt-get reads a local repository of the .debs it asks for, downloaded when
# the base is made, so every build step runs with no network at all. Nothing of either mount
# lands in the image; the same Dockerfile builds with `docker build .` from public bases.
#
#   usage: sudo bash scripts/build-image.sh [IMAGE]
#     IMAGE defaults to the DaemonSet's image (deploy/daemonset.yaml), as localhost/NAME:TAG.
#   env:   WORK   [/var/tmp/kube-proxy-rs-image]  base tarballs, local apt repository, image store
#          SAVE   a path: also write the image there as a docker-archive (podman/docker load,
#                 kind load image-archive, ctr images import)
#          REBUILD_BASES=1  make the base images again even if their inputs did not change
#
# Afterwards the image is in a private store: `source $WORK/env.sh; podman images`.
# No container gets a network (buildah --network none); the host's network is never touched.
set -euo pipefail

die() { echo "build-image.sh: $*" >&2; exit 1; }
step() { printf '==> [%s] %s\n' "$(date +%T)" "$*"; }

[ "$(id -u)" -eq 0 ] || die "needs root (mmdebstrap and rootful buildah): sudo bash $0"
project=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/var/tmp/kube-proxy-rs-image}
case "$WORK/" in "$project"/*) die "WORK ($WORK) must be outside the checkout: the build context is the checkout" ;; esac

daemonset_image=$(sed -n 's/^ *image: *//p' "$project/deploy/daemonset.yaml" | head -1)
[ -n "$daemonset_image" ] || die "no image: in deploy/daemonset.yaml"
image=${1:-$daemonset_image}
case "$image" in */*) ;; *) image=localhost/$image ;; esac

# The base images, as the Dockerfile's FROM lines name them (build stage first).
mapfile -t bases < <(sed -n 's/^FROM \([^ ]*\).*/\1/p' "$project/Dockerfile")
[ "${#bases[@]}" -eq 2 ] || die "expected two FROM lines in the Dockerfile, found ${#bases[@]}"
rust_base=${bases[0]} runtime_base=${bases[1]}
case "$rust_base:$runtime_base" in
  rust:*-bookworm:debian:bookworm-slim) ;;
  *) die "this script makes rust:*-bookworm and debian:bookworm-slim; the Dockerfile uses $rust_base and $runtime_base" ;;
esac

step "tools (Debian's buildah, podman, runc, mmdebstrap)"
tools=(buildah podman runc conmon catatonit containernetworking-plugins mmdebstrap debootstrap dpkg-dev)
missing=()
for package in "${tools[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]}"
  apt-get update -qq
  # Without recommends: crun (fails on this kind of host's hybrid cgroups), slirp4netns and
  # netavark are not wanted.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

step "private container configuration in $WORK"
mkdir -p "$WORK"/{storage,run,tmp,networks,repo}
# A store keeps the settings it was first used with: every podman/buildah call must see these.
cat > "$WORK/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$WORK/storage"
runroot = "$WORK/run"
EOF
cat > "$WORK/registries.conf" <<'EOF'
# No registry is searched: short names (FROM debian:bookworm-slim) resolve to localhost/.
unqualified-search-registries = []
short-name-mode = "disabled"
EOF
# runc, not crun; cgroupfs and file events (no systemd here); ulimits within the caller's hard
# limits (podman's defaults exceed what a root without CAP_SYS_RESOURCE may set).
nofile=$(ulimit -Hn); { [ "$nofile" = unlimited ] || [ "$nofile" -gt 1048576 ]; } && nofile=1048576
nproc=$(ulimit -Hu); { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
cat > "$WORK/containers.conf" <<EOF
[containers]
netns = "none"
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$WORK/tmp"
[network]
network_config_dir = "$WORK/networks"
EOF
cat > "$WORK/env.sh" <<EOF
export CONTAINERS_CONF=$WORK/containers.conf
export CONTAINERS_STORAGE_CONF=$WORK/storage.conf
export CONTAINERS_REGISTRIES_CONF=$WORK/registries.conf
EOF
# shellcheck disable=SC1091
. "$WORK/env.sh"

# Debian's mirror and security archive, as this machine's apt knows them.
apt_uris=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
  | sed -n -E 's/^(deb|URIs:)[[:space:]]+(\[[^]]*\][[:space:]]+)?//p' | tr ' ' '\n' | grep -E '^https?://' || true)
mirror=${MIRROR:-$(grep -v -- -security <<<"$apt_uris" | head -1 || true)}
security=${SECURITY:-$(grep -- -security <<<"$apt_uris" | head -1 || true)}
[ -n "$mirror" ] || die "no Debian mirror in apt's sources: set MIRROR"
security=${security:-${mirror%/debian}/debian-security}
sources=("deb $mirror bookworm main" "deb $mirror bookworm-updates main" "deb $security bookworm-security main")
# What debian:bookworm-slim leaves out, kept in the image so later installs stay slim too.
slim=()
for path in /usr/share/doc/'*' /usr/share/groff/'*' /usr/share/info/'*' /usr/share/linda/'*' \
            /usr/share/lintian/overrides/'*' /usr/share/locale/'*' /usr/share/man/'*'; do
  slim+=(--dpkgopt="path-exclude=$path")
done
slim+=(--dpkgopt='path-include=/usr/share/doc/*/copyright')

runtime_packages=$(sed -n 's/^packages="\(.*\)"$/\1/p' "$project/scripts/image/install-runtime-packages.sh")
[ -n "$runtime_packages" ] || die 'no packages="..." line in scripts/image/install-runtime-packages.sh'
rust_packages="rustc-web cargo-web gcc libc6-dev make pkg-config ca-certificates"

# The customize hook for both bases: apt settings of Docker's Debian images, no host traces,
# and for the runtime base the .debs its apt-get will want, resolved against this very base.
cat > "$WORK/customize.sh" <<'EOF'
#!/bin/sh
# usage: customize.sh ROOT [REPO PACKAGE...]
set -eu
root=$1; shift
if [ $# -gt 1 ]; then
  repo=$1; shift
  mkdir -p "$root/var/cache/kp-debs/partial"
  chroot "$root" apt-get install -qq -y --download-only --no-install-recommends \
    -o Dir::Cache::archives=/var/cache/kp-debs "$@"
  rm -f "$repo"/*.deb
  mv "$root"/var/cache/kp-debs/*.deb "$repo"/
  rm -rf "$root/var/cache/kp-debs"
fi
conf=$root/etc/apt/apt.conf.d
printf '%s\n' 'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };' \
  'Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";' > "$conf/docker-clean"
echo 'Acquire::Languages "none";' > "$conf/docker-no-languages"
rm -rf "$root/etc/resolv.conf" "$root/etc/hostname" "$root"/var/lib/apt/lists/* \
  "$root"/var/cache/apt/*.bin "$root"/var/log/*.log "$root"/var/log/apt/*
EOF
chmod +x "$WORK/customize.sh"

# make_base NAME PACKAGES [REPO]: $WORK/NAME.tar from mmdebstrap, remade only when its inputs change.
make_base() {
  local name=$1 packages=$2 repo=${3:-} inputs
  inputs="$packages|$repo|${sources[*]}|$(sha256sum "$WORK/customize.sh" | cut -c1-16)"
  if [ "${REBUILD_BASES:-0}" != 1 ] && [ -s "$WORK/$name.tar" ] && [ "$(cat "$WORK/$name.inputs" 2>/dev/null)" = "$inputs" ]; then
    echo "$name.tar is up to date"
    return
  fi
  local hook="$WORK/customize.sh \"\$1\""
  local include=()
  if [ -n "$repo" ]; then hook="$hook $repo $packages"; else include=(--include="${packages// /,}"); fi
  local t=$(date +%s)
  # The merged-usr hook gives usr-is-merged as Docker's images have (else apt pulls usrmerge).
  # Device nodes stay out (the runtime provides /dev).
  mmdebstrap --variant=minbase --mode=root --format=tar \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr "${slim[@]}" "${include[@]}" \
    --customize-hook="$hook" bookworm - "${sources[@]}" 2> "$WORK/$name.log" \
    | mmtarfilter --path-exclude='/dev/*' > "$WORK/$name.tar.new" \
    || { tail -20 "$WORK/$name.log" >&2; die "mmdebstrap $name failed (log: $WORK/$name.log)"; }
  mv "$WORK/$name.tar.new" "$WORK/$name.tar"
  echo "$inputs" > "$WORK/$name.inputs"
  echo "$name.tar made in $(( $(date +%s) - t )) s"
}

step "base image $runtime_base (with a local repository of: $runtime_packages)"
make_base runtime "$runtime_packages" "$WORK/repo"
(cd "$WORK/repo" && dpkg-scanpackages --multiversion . /dev/null > Packages 2>/dev/null)
echo 'deb [trusted=yes] file:/var/lib/kube-proxy-rs-debs ./' > "$WORK/local.list"
podman import --quiet --change 'CMD ["bash"]' "$WORK/runtime.tar" "localhost/$runtime_base" > /dev/null

step "base image $rust_base (Debian's rustc-web and cargo-web)"
make_base rust "$rust_packages"
podman import --quiet --change 'ENV CARGO_HOME=/usr/local/cargo' \
  --change 'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["bash"]' "$WORK/rust.tar" "localhost/$rust_base" > /dev/null
podman run --rm --network none "localhost/$rust_base" sh -c 'rustc --version && cargo --version' | sed 's/^/   /'

step "crates for Cargo.lock in the local registry"
(cd "$project" && cargo fetch --locked --quiet) || die "cargo fetch --locked failed (crates.io unreachable and crates not downloaded yet?)"
# Where that cargo keeps them: CARGO_HOME, ~/.cargo, or beside a toolchain installed elsewhere.
cargo_home=""
for candidate in "${CARGO_HOME:-}" "$HOME/.cargo" "$(dirname "$(dirname "$(command -v cargo)")")"; do
  if [ -n "$candidate" ] && [ -d "$candidate/registry/cache" ]; then cargo_home=$candidate; break; fi
done
[ -n "$cargo_home" ] || die "cannot find cargo's registry (set CARGO_HOME)"
echo "   from $cargo_home/registry"
printf '[net]\noffline = true\n' > "$WORK/cargo-offline.toml"

step "image $image from $project/Dockerfile"
t=$(date +%s)
# The volumes exist for RUN steps only: the crates and an offline switch for cargo, the local
# repository in place of the runtime base's apt sources. --layers=false: no stale stage reuse.
status=0
buildah bud --pull=never --isolation oci --network none --layers=false \
  -v "$cargo_home/registry:/usr/local/cargo/registry" \
  -v "$WORK/cargo-offline.toml:/usr/local/cargo/config.toml:ro" \
  -v "$WORK/local.list:/etc/apt/sources.list:ro" \
  -v "$WORK/repo:/var/lib/kube-proxy-rs-debs:ro" \
  -f "$project/Dockerfile" -t "$image" "$project" > "$WORK/build.log" 2>&1 || status=$?
grep -v -E '^(Copying (blob|config)|Writing manifest|Storing signatures|Selecting previously|Preparing to unpack|Unpacking|\(Reading database|   Compiling )' "$WORK/build.log" || true
[ "$status" -eq 0 ] || die "buildah bud failed (exit $status; log: $WORK/build.log)"
build_seconds=$(( $(date +%s) - t ))
podman image prune -f > /dev/null
size=$(podman image inspect "$image" --format '{{.Size}}')
podman run --rm --network none "$image" --version | sed 's/^/   /'

if [ -n "${SAVE:-}" ]; then
  rm -f "$SAVE"
  podman save --quiet --format docker-archive -o "$SAVE" "$image"
  echo "   saved to $SAVE ($(du -h "$SAVE" | cut -f1))"
fi
echo "built $image: $(awk -v b="$size" 'BEGIN{printf "%.1f MB", b/1e6}'), image build ${build_seconds} s, all ${SECONDS} s"
echo "use it: source $WORK/env.sh && podman run --rm --network none $image --help"
