//! What both modes' names are made of: the base32 SHA-256 of a readable name, cut short, as
//! upstream hashes its chain names.

use std::collections::HashSet;

use sha2::{Digest, Sha256};

/// A set of chain names looked up often (at 10,000 services, 120,000 in iptables mode and
/// 20,000 in nftables mode): hashed, with a hash faster than the standard one's (sorted sets
/// and SipHash took most of an nftables restart's full sync).
pub type ChainSet = HashSet<String, ahash::RandomState>;

/// The first `length` characters of the base32 encoding of `text`'s SHA-256.
pub fn base32_sha256(text: &str, length: usize) -> String {
    base32_sha256_of([text], length)
}

/// [`base32_sha256`] of the concatenation of `parts`, without concatenating them.
pub fn base32_sha256_of<'a>(parts: impl IntoIterator<Item = &'a str>, length: usize) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let mut encoded = data_encoding::BASE32.encode(&digest);
    encoded.truncate(length);
    encoded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_hash_as_their_concatenation() {
        let whole = base32_sha256("spec\nrule one\nrule two", 16);
        assert_eq!(whole.len(), 16);
        assert_eq!(
            base32_sha256_of(["spec", "\n", "rule one", "\n", "rule two"], 16),
            whole
        );
        assert_ne!(base32_sha256_of(["spec", "rule one"], 16), whole);
    }
}
