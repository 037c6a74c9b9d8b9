//! FNV-1a, 64 bits: a hash that is the same in every build and release, which what a restarted
//! daemon reads back from the table (slot places, digests) needs.

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0100_0000_01b3;

/// A running FNV-1a hash.
#[derive(Clone, Copy, Debug)]
pub struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(OFFSET_BASIS)
    }
}

impl Fnv64 {
    pub fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(PRIME);
        }
    }

    /// `text` followed by a byte no text of ours holds, so that `("ab", "c")` and `("a", "bc")`
    /// hash apart.
    pub fn write_part(&mut self, text: &str) {
        self.write(text.as_bytes());
        self.write(&[0xff]);
    }

    pub fn finish(self) -> u64 {
        self.0
    }
}

/// FNV-1a of `text`.
pub fn fnv1a_64(text: &str) -> u64 {
    let mut hash = Fnv64::default();
    hash.write(text.as_bytes());
    hash.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_values_of_the_published_algorithm() {
        // From the FNV authors' test vectors.
        assert_eq!(fnv1a_64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64("foobar"), 0x8594_4171_f739_67e8);
    }
}
