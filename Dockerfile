# kube-proxy-rs image: `docker build -t REGISTRY/kube-proxy-rs:0.1.0 .`
# Every step past the base images is a script in scripts/image/, which tests/image.rs runs
# outside Docker (no Docker engine is needed to test what the image does).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# The target directory is a cache mount (BuildKit, buildah): a rebuild compiles what changed.
# The binary leaves it in the same step.
RUN --mount=type=cache,id=kube-proxy-rs-target,target=/src/target \
    cargo build --release --locked --bin kube-proxy-rs \
 && scripts/image/install-binary.sh target/release/kube-proxy-rs /out

FROM debian:bookworm-slim
COPY scripts/image/install-runtime-packages.sh scripts/image/check-runtime.sh \
     scripts/image/iptables-wrapper.sh scripts/image/install-iptables-wrapper.sh /usr/local/lib/kube-proxy-rs/
RUN /usr/local/lib/kube-proxy-rs/install-runtime-packages.sh \
 && /usr/local/lib/kube-proxy-rs/install-iptables-wrapper.sh \
 && /usr/local/lib/kube-proxy-rs/check-runtime.sh
COPY --from=build /out/ /
RUN /usr/local/bin/kube-proxy --version
# The DaemonSet runs this container privileged in the host's network namespace: it programs
# the node's netfilter tables, IPVS, the kube-ipvs0 link and sysctls, as kube-proxy does.
ENTRYPOINT ["/usr/local/bin/kube-proxy-rs"]
