//! Gates the next upstream release registers that the release we follow does not, as its
//! changelog announces them (v1.38.0-alpha.1: ManagedFieldsOptOut, KEP-5958, #139561;
//! CertificateSigningRequestMLDSA, #142196). Upstream 1.37 refuses them as unknown; we accept
//! them with a warning and ignore them, so that a manifest written for 1.38 starts us too.

pub const ANNOUNCED: &[(&str, &str)] = &[
    ("CertificateSigningRequestMLDSA", "1.38"),
    ("ManagedFieldsOptOut", "1.38"),
];
