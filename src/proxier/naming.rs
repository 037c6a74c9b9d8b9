//! What both modes' names are made of: the base32 SHA-256 of a readable name, cut short, as
//! upstream hashes its chain names.

use sha2::{Digest, Sha256};

/// The first `length` characters of the base32 encoding of `text`'s SHA-256.
pub fn base32_sha256(text: &str, length: usize) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let mut encoded = data_encoding::BASE32.encode(&digest);
    encoded.truncate(length);
    encoded
}
