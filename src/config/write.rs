//! The configuration written back as a KubeProxyConfiguration file, as upstream's
//! `--write-config-to` writes it: every field with its default filled in, keys sorted, and the
//! platform's defaults (mode `iptables`, detectLocalMode `ClusterCIDR`) spelled out.

use serde_json::{Value, json};

use super::types::KubeProxyConfiguration;

/// `config` as YAML that upstream kube-proxy and this program both read back unchanged.
pub fn config_yaml(config: &KubeProxyConfiguration) -> Result<String, String> {
    let value = filled(config)?;
    // serde_json's maps are sorted, as the keys upstream writes.
    serde_yaml_ng::to_string(&value).map_err(|e| e.to_string())
}

/// What `/configz` on the metrics address answers, as upstream 1.36 does (kubernetes#136044):
/// the configuration in force, with its apiVersion and kind, under the group's name.
pub fn configz_json(config: &KubeProxyConfiguration) -> Result<String, String> {
    let value = filled(config)?;
    serde_json::to_string(&json!({ "kubeproxy.config.k8s.io": value })).map_err(|e| e.to_string())
}

/// `config` as a JSON value, every default filled in and the platform's spelled out.
fn filled(config: &KubeProxyConfiguration) -> Result<Value, String> {
    let mut config = config.clone();
    config.apply_defaults();
    if config.mode.is_empty() {
        config.mode = "iptables".into();
    }
    if config.detect_local_mode.is_empty() {
        config.detect_local_mode = "ClusterCIDR".into();
    }
    let mut value = serde_json::to_value(&config).map_err(|e| e.to_string())?;
    fill_logging(&mut value);
    if value.get("winkernel").is_some_and(Value::is_null) {
        value["winkernel"] = json!({
            "enableDSR": false, "forwardHealthCheckVip": false, "networkName": "",
            "rootHnsEndpointName": "", "sourceVip": ""
        });
    }
    Ok(value)
}

/// The logging section as component-base defaults it.
fn fill_logging(value: &mut Value) {
    let Some(logging) = value.get_mut("logging").and_then(Value::as_object_mut) else {
        return;
    };
    if logging.get("flushFrequency").is_none_or(Value::is_null) {
        logging.insert("flushFrequency".into(), json!("5s"));
    }
    if logging.get("options").is_none_or(Value::is_null) {
        logging.insert(
            "options".into(),
            json!({"json": {"infoBufferSize": "0"}, "text": {"infoBufferSize": "0"}}),
        );
    }
    if logging.get("vmodule").is_some_and(Value::is_null) {
        logging.remove("vmodule");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::decode_config;

    #[test]
    fn what_is_written_reads_back_the_same_and_strictly() {
        let mut config = KubeProxyConfiguration {
            cluster_cidr: "10.0.0.0/8".into(),
            ..KubeProxyConfiguration::default()
        };
        config.feature_gates.insert("AllAlpha".into(), false);
        let text = config_yaml(&config).unwrap();
        assert!(
            text.contains("apiVersion: kubeproxy.config.k8s.io/v1alpha1"),
            "{text}"
        );
        assert!(text.contains("kind: KubeProxyConfiguration"), "{text}");
        assert!(text.contains("mode: iptables"), "{text}");
        assert!(text.contains("detectLocalMode: ClusterCIDR"), "{text}");
        assert!(text.contains("flushFrequency: 5s"), "{text}");
        let keys: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with(' ') && l.contains(':'))
            .map(|l| l.split(':').next().unwrap_or_default())
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        let decoded = decode_config(&text, "written").unwrap();
        assert!(
            decoded.unknown_fields.is_empty(),
            "{:?}",
            decoded.unknown_fields
        );
        let mut expected = config.clone();
        expected.apply_defaults();
        assert_eq!(decoded.config.cluster_cidr, expected.cluster_cidr);
        assert_eq!(decoded.config.iptables, expected.iptables);
        assert_eq!(decoded.config.conntrack, expected.conntrack);
        assert_eq!(decoded.config.feature_gates, expected.feature_gates);
    }
}
