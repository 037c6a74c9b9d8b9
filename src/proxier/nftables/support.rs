//! Whether this node can run nftables mode, checked before anything is programmed (as upstream
//! does): a kernel new enough (5.13, which upstream requires), an `nft` binary new enough (1.0.1:
//! older ones parse the whole ruleset and can crash on other programs' objects), and nf_tables
//! accepting every expression our table uses (a sample the kernel checks and aborts, sent over
//! netlink: `nft --check` would read the family's ruleset first, which on a programmed node
//! takes 0.1 s and reads other programs' objects).

use crate::model::IpFamily;
use crate::sys::nf_tables::{self as nftables, NftError, family_keyword};

/// upstream's minimum kernel for nftables mode.
const MIN_KERNEL: (u32, u32) = (5, 13);
/// The oldest `nft` that writes only what it is given.
const MIN_NFT: (u32, u32, u32) = (1, 0, 1);
/// Set to skip the kernel version check, as upstream allows.
pub const SKIP_KERNEL_CHECK_ENV: &str = "KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK";

/// Why nftables mode cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum NftablesUnsupported {
    #[error("kernel {found} is older than {}.{}, which nftables mode needs (set {SKIP_KERNEL_CHECK_ENV} to try anyway)", MIN_KERNEL.0, MIN_KERNEL.1)]
    Kernel { found: String },
    #[error("the nft binary is missing or cannot run: {0}")]
    NoNft(String),
    #[error("nft {found} is older than {}.{}.{}, which nftables mode needs", MIN_NFT.0, MIN_NFT.1, MIN_NFT.2)]
    OldNft { found: String },
    #[error("nf_tables refused the kube-proxy table's expressions: {0}")]
    Refused(NftError),
}

/// Checks the node; `kernel_release` is `uname -r`'s answer.
pub fn check_support(
    kernel_release: &str,
    skip_kernel_check: bool,
) -> Result<(), NftablesUnsupported> {
    if !skip_kernel_check && kernel_version(kernel_release).is_some_and(|v| v < MIN_KERNEL) {
        return Err(NftablesUnsupported::Kernel {
            found: kernel_release.to_string(),
        });
    }
    let version = nftables::nft_version().map_err(|e| NftablesUnsupported::NoNft(e.to_string()))?;
    if version < MIN_NFT {
        return Err(NftablesUnsupported::OldNft {
            found: format!("{}.{}.{}", version.0, version.1, version.2),
        });
    }
    nftables::check(&probe(IpFamily::V4)).map_err(NftablesUnsupported::Refused)
}

/// The running kernel's release (`/proc/sys/kernel/osrelease`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `6.1.0-27-amd64` -> (6, 1).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// A table using every kind of expression ours does, under a name no one uses (the check never
/// commits it anyway). IPv4 only.
fn probe(family: IpFamily) -> String {
    let f = family_keyword(family);
    let t = "kube-proxy-probe";
    [
        format!("add table {f} {t}"),
        format!("add chain {f} {t} nat-prerouting {{ type nat hook prerouting priority -100 ; }}"),
        format!("add chain {f} {t} filter-input {{ type filter hook input priority 0 ; }}"),
        format!("add chain {f} {t} endpoint"),
        format!("add chain {f} {t} reject-chain"),
        format!("add map {f} {t} service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"probe\" ; }}"),
        format!("add set {f} {t} affinity {{ type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }}"),
        format!("add map {f} {t} endpoints {{ typeof numgen random mod 16384 : ip daddr . tcp dport ; flags interval ; }}"),
        format!("add rule {f} {t} nat-prerouting ip daddr . meta l4proto . th dport vmap @service-ips"),
        format!("add rule {f} {t} nat-prerouting fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto tcp numgen random mod 1 vmap {{ 0 : goto endpoint }}"),
        format!("add rule {f} {t} filter-input ct state new ip daddr 10.0.0.1 jump reject-chain"),
        format!("add rule {f} {t} reject-chain reject"),
        format!("add rule {f} {t} endpoint ip saddr @affinity goto reject-chain"),
        format!("add rule {f} {t} endpoint update @affinity {{ ip saddr }}"),
        format!("add rule {f} {t} endpoint mark set mark or 0x4000"),
        format!("add rule {f} {t} endpoint meta l4proto tcp dnat to 10.0.0.1:80"),
        format!("add chain {f} {t} nat-postrouting {{ type nat hook postrouting priority 100 ; }}"),
        format!("add rule {f} {t} nat-postrouting masquerade fully-random"),
        format!("add set {f} {t} hairpin {{ type ipv4_addr . ipv4_addr . inet_proto . inet_service ; }}"),
        format!("add rule {f} {t} nat-postrouting mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random"),
        format!("add rule {f} {t} nat-postrouting ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin masquerade fully-random"),
        format!("add counter {f} {t} rejected"),
        format!("add rule {f} {t} reject-chain counter name \"rejected\" reject"),
        format!("add rule {f} {t} nat-prerouting meta l4proto tcp dnat ip addr . port to numgen random mod 16384 offset 16384 map @endpoints"),
        format!("add element {f} {t} service-ips {{ 10.0.0.1 . tcp . 80 : goto endpoint }}"),
        format!("add element {f} {t} endpoints {{ 16384-32767 : 10.0.0.1 . 80 }}"),
    ]
    .join("\n")
        + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_compare_as_upstream_requires() {
        assert_eq!(kernel_version("6.1.0-27-amd64"), Some((6, 1)));
        assert_eq!(kernel_version("5.4.0"), Some((5, 4)));
        assert_eq!(kernel_version("weird"), None);
        assert!(matches!(
            check_support("5.4.0-generic", false),
            Err(NftablesUnsupported::Kernel { .. })
        ));
    }

    /// The probe is checked over netlink (no `nft` reading the ruleset at start-up).
    #[test]
    fn the_probe_compiles_to_netlink_messages() {
        let text = probe(IpFamily::V4);
        let compiled = crate::sys::nf_tables::write::compile(&text)
            .unwrap_or_else(|err| panic!("{err}\n{text}"));
        assert!(compiled.messages.len() >= text.lines().count());
    }
}
