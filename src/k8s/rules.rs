//! The API server's own rules for what reaches kernel input, checked again here: names (they go
//! into rule comments) and addresses. The node never depends on the API server having validated
//! an object. Addresses are parsed as upstream parses them (`netutils.ParseIPSloppy`): IPv4
//! octets with leading zeros, which older API servers accepted, are read as decimal.

/// A DNS-1123 label (namespaces, Service names, EndpointSlice port names): at most 63 of
/// `[a-z0-9-]`, starting and ending with a letter or digit.
pub fn is_dns1123_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-')
}

/// A DNS-1123 subdomain (object names): at most 253 characters, dot-separated labels.
pub fn is_dns1123_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns1123_label)
}

/// An IANA service name (Service port names): at most 15 of `[a-z0-9-]`, at least one letter,
/// no hyphen at either end and no two in a row.
pub fn is_iana_service_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 15
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.iter().any(u8::is_ascii_lowercase)
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-')
        && !name.contains("--")
}

pub use crate::model::address::{parse_cidr, parse_ip};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_api_rules() {
        for good in ["default", "kube-system", "a", "9lives", &"x".repeat(63)] {
            assert!(is_dns1123_label(good), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a b",
            "a\"b",
            "a\nb",
            "a$(x)",
            "a.b",
            &"x".repeat(64),
        ] {
            assert!(!is_dns1123_label(bad), "{bad:?}");
        }
        assert!(is_dns1123_subdomain("web-1.abc"));
        assert!(!is_dns1123_subdomain("web..1"));
        for good in ["http", "p80", "dns-tcp", "a1"] {
            assert!(is_iana_service_name(good), "{good}");
        }
        for bad in [
            "",
            "80",
            "-http",
            "http-",
            "a--b",
            "HTTP",
            "h\"ttp",
            "a b",
            "abcdefghijklmnop",
        ] {
            assert!(!is_iana_service_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn addresses_parse_as_upstream_parses_them() {
        assert_eq!(
            parse_ip("172.30.0.041"),
            Some("172.30.0.41".parse().unwrap())
        );
        assert_eq!(parse_ip(" 10.0.0.1 "), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(parse_ip("fd00::1"), Some("fd00::1".parse().unwrap()));
        assert_eq!(
            parse_ip("010.000.000.001"),
            Some("10.0.0.1".parse().unwrap())
        );
        for bad in [
            "256.0.0.1",
            "1.2.3",
            "1.2.3.4.5",
            "1.2.3.0x4",
            "1..2.3",
            "0001.2.3.4",
            "",
        ] {
            assert_eq!(parse_ip(bad), None, "{bad}");
        }
        assert_eq!(
            parse_cidr("203.0.113.000/025"),
            Some("203.0.113.0/25".parse().unwrap())
        );
        assert_eq!(
            parse_cidr("10.1.2.3/8"),
            Some("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(parse_cidr("fd00::/64"), Some("fd00::/64".parse().unwrap()));
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/-1",
            "x/8",
            "fd00::/129",
        ] {
            assert_eq!(parse_cidr(bad), None, "{bad}");
        }
    }
}
