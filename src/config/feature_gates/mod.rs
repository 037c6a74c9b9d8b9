//! The feature gates kube-proxy-rs accepts: every gate the upstream kube-proxy binary of the
//! release we follow registers (known.rs: Kubernetes' pkg/features, the generic apiserver's,
//! apiextensions', controller-manager's, client-go's, component-base's logging, metrics and
//! zpages gates, AllAlpha/AllBeta), each with its stage, default and whether it is locked to
//! its default; and, beyond upstream, the gates older releases registered (retired.rs) and those
//! the next release announces (announced.rs), so that a manifest of any release operators run,
//! or of the next, still starts us. `--feature-gates` and the file's `featureGates` are checked
//! as upstream checks them.

mod announced;
mod known;
mod retired;

pub use announced::ANNOUNCED;
pub use known::KNOWN;
pub use retired::RETIRED;

/// The upstream release whose gates [`KNOWN`] lists.
pub const RELEASE: &str = "1.37";

/// A gate's stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    Ga,
    Deprecated,
}

impl Stage {
    /// As `kubernetes_feature_enabled{stage}` spells it (GA is empty).
    pub fn label(self) -> &'static str {
        match self {
            Stage::Alpha => "ALPHA",
            Stage::Beta => "BETA",
            Stage::Ga => "",
            Stage::Deprecated => "DEPRECATED",
        }
    }
}

/// Why a feature gate setting is refused (the words are upstream's).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("unrecognized feature gate: {0}")]
    Unknown(String),
    #[error("cannot set feature gate {name} to {value}, feature is locked to {default}")]
    Locked {
        name: String,
        value: bool,
        default: bool,
    },
}

/// Checks `gates` (name -> value); returns warnings for GA and deprecated gates that are set.
pub fn check(gates: &std::collections::BTreeMap<String, bool>) -> Result<Vec<String>, GateError> {
    let mut warnings = Vec::new();
    for (name, value) in gates {
        let Some((_, stage, default, locked)) = KNOWN.iter().find(|(n, ..)| n == name) else {
            if let Some((_, last)) = RETIRED.iter().find(|(n, _)| n == name) {
                warnings.push(format!(
                    "Feature gate {name} is not registered by upstream kube-proxy {RELEASE} (its last release with it: {last}); the setting {name}={value} is ignored"
                ));
                continue;
            }
            if let Some((_, since)) = ANNOUNCED.iter().find(|(n, _)| n == name) {
                warnings.push(format!(
                    "Feature gate {name} is registered by upstream kube-proxy from {since}, not by {RELEASE}, the release followed; the setting {name}={value} is ignored"
                ));
                continue;
            }
            return Err(GateError::Unknown(name.clone()));
        };
        if *locked && value != default {
            return Err(GateError::Locked {
                name: name.clone(),
                value: *value,
                default: *default,
            });
        }
        match stage {
            Stage::Ga => warnings.push(format!(
                "Setting GA feature gate {name}={value}. It will be removed in a future release."
            )),
            Stage::Deprecated => warnings.push(format!(
                "Setting deprecated feature gate {name}={value}. It will be removed in a future release."
            )),
            _ => {}
        }
    }
    Ok(warnings)
}

/// The gate that lets Services' externalIPs be programmed (KEP-5707; upstream turns it off by
/// default in 1.40).
pub const ALLOW_SERVICE_EXTERNAL_IPS: &str = "AllowServiceExternalIPs";

/// Whether `name` is on, given what was set: a gate the release we follow registers, set or
/// by default; any other (retired, announced, unknown) is off whatever it was set to.
pub fn enabled(gates: &std::collections::BTreeMap<String, bool>, name: &str) -> bool {
    KNOWN
        .iter()
        .find(|(n, ..)| *n == name)
        .is_some_and(|(_, _, default, _)| gates.get(name).copied().unwrap_or(*default))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn gates(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
        pairs.iter().map(|(n, v)| (n.to_string(), *v)).collect()
    }

    #[test]
    fn gates_are_checked_as_upstream_checks_them() {
        assert!(
            check(&gates(&[("LoggingAlphaOptions", true)]))
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            check(&gates(&[("DynamicKubeletConfig", false)])),
            Err(GateError::Unknown("DynamicKubeletConfig".into()))
        );
        assert!(matches!(
            check(&gates(&[("NFTablesProxyMode", false)])),
            Err(GateError::Locked { .. })
        ));
        let warnings = check(&gates(&[("NFTablesProxyMode", true)])).unwrap();
        assert!(warnings[0].contains("Setting GA feature gate NFTablesProxyMode=true"));
        assert!(enabled(&gates(&[]), "PreferSameTrafficDistribution"));
        assert!(!enabled(&gates(&[]), "AllAlpha"));
    }

    #[test]
    fn the_lists_are_sorted_and_apart() {
        assert!(KNOWN.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(RETIRED.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(ANNOUNCED.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(KNOWN.len() > 200);
        let known = |name: &str| KNOWN.iter().any(|(known, ..)| *known == name);
        assert!(RETIRED.iter().all(|(name, _)| !known(name)));
        assert!(ANNOUNCED.iter().all(|(name, _)| !known(name)));
        assert!(
            ANNOUNCED
                .iter()
                .all(|(name, _)| RETIRED.iter().all(|(retired, _)| retired != name))
        );
    }

    #[test]
    fn gates_of_the_releases_operators_run_are_accepted() {
        // 1.37's kube-proxy gates: IPVS mode's, deprecated (on by default), and the localhost
        // NodePort proxy's.
        let warnings = check(&gates(&[("KubeProxyIPVS", true)])).unwrap();
        assert!(warnings[0].contains("Setting deprecated feature gate KubeProxyIPVS=true"));
        assert!(enabled(&gates(&[]), "KubeProxyIPVS"));
        assert!(!enabled(&gates(&[]), "KubeProxyNFTablesLocalhostNodePorts"));
        let warnings = check(&gates(&[("KubeProxyNFTablesLocalhostNodePorts", true)])).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        // A gate 1.35 had and 1.37 dropped: ignored with a warning, not refused.
        let warnings = check(&gates(&[("ServiceTrafficDistribution", true)])).unwrap();
        assert!(
            warnings[0].contains("not registered by upstream kube-proxy 1.37"),
            "{warnings:?}"
        );
        // A gate 1.38 announces: ignored with a warning, not refused; set on, it stays off.
        let set = gates(&[("ManagedFieldsOptOut", true)]);
        let warnings = check(&set).unwrap();
        assert!(
            warnings[0].contains("registered by upstream kube-proxy from 1.38"),
            "{warnings:?}"
        );
        assert!(!enabled(&set, "ManagedFieldsOptOut"));
        assert!(!enabled(
            &gates(&[("ServiceTrafficDistribution", true)]),
            "ServiceTrafficDistribution"
        ));
        assert!(!enabled(
            &gates(&[("KubeProxyIPVS", false)]),
            "KubeProxyIPVS"
        ));
    }
}
