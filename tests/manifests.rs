//! The manifests in deploy/, parsed with the Kubernetes API types: what an operator applies must
//! hang together (selectors, names, probes, mounts), grant no more than the daemon needs, and
//! carry a config.conf our own configuration code accepts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodTemplateSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube_proxy_rs::config::{decode_config, validate};
use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

fn parse<T: DeserializeOwned>(path: &str) -> T {
    let text = std::fs::read_to_string(deploy(path)).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn daemonset() -> DaemonSet {
    parse("daemonset.yaml")
}

fn container(template: &PodTemplateSpec) -> Container {
    let spec = template.spec.as_ref().expect("pod spec");
    assert_eq!(spec.containers.len(), 1);
    spec.containers[0].clone()
}

#[test]
fn kustomization_lists_every_manifest() {
    let kustomization: Value = parse("kustomization.yaml");
    assert_eq!(kustomization["namespace"].as_str(), Some("kube-system"));
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    let present: BTreeSet<String> = std::fs::read_dir(deploy(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".yaml") && name != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present);
}

#[test]
fn rbac_grants_reads_of_services_slices_nodes_service_cidrs_and_events_only() {
    let role: ClusterRole = parse("clusterrole.yaml");
    let mut granted = BTreeSet::new();
    for rule in role.rules.unwrap() {
        for group in rule.api_groups.unwrap_or_default() {
            for resource in rule.resources.clone().unwrap_or_default() {
                for verb in &rule.verbs {
                    granted.insert(format!("{group}/{resource}:{verb}"));
                }
            }
        }
        assert!(rule.resource_names.is_none() && rule.non_resource_urls.is_none());
    }
    let mut expected = BTreeSet::new();
    for (group, resource) in [
        ("", "services"),
        ("", "nodes"),
        ("discovery.k8s.io", "endpointslices"),
        ("networking.k8s.io", "servicecidrs"),
    ] {
        for verb in ["get", "list", "watch"] {
            expected.insert(format!("{group}/{resource}:{verb}"));
        }
    }
    for group in ["", "events.k8s.io"] {
        for verb in ["create", "patch"] {
            expected.insert(format!("{group}/events:{verb}"));
        }
    }
    assert_eq!(granted, expected);

    let binding: ClusterRoleBinding = parse("clusterrolebinding.yaml");
    let account: ServiceAccount = parse("serviceaccount.yaml");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(Some(binding.role_ref.name), role.metadata.name);
    let subjects = binding.subjects.unwrap();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].kind, "ServiceAccount");
    assert_eq!(Some(subjects[0].name.clone()), account.metadata.name);
    assert_eq!(subjects[0].namespace, account.metadata.namespace);
    let pod = daemonset().spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name, account.metadata.name);
}

#[test]
fn configmap_holds_a_config_our_validation_accepts_and_a_kubeadm_kubeconfig() {
    let map: ConfigMap = parse("configmap.yaml");
    assert_eq!(map.metadata.name.as_deref(), Some("kube-proxy"));
    assert_eq!(map.metadata.namespace.as_deref(), Some("kube-system"));
    let data = map.data.unwrap();
    let decoded = decode_config(&data["config.conf"], "config.conf").expect("decodes");
    assert!(
        decoded.unknown_fields.is_empty(),
        "kubeadm's fields are all known: {:?}",
        decoded.unknown_fields
    );
    let mut config = decoded.config;
    assert_eq!(config.mode, "iptables");
    config.apply_defaults();
    assert_eq!(validate(&config), vec![]);

    // The kubeconfig is where config.conf says, in the mounted ConfigMap, and uses the pod's
    // service account token and CA as kubeadm's does.
    let ds = daemonset();
    let mount = container(&ds.spec.template)
        .volume_mounts
        .unwrap()
        .into_iter()
        .find(|m| m.name == "kube-proxy")
        .unwrap();
    assert_eq!(
        config.client_connection.kubeconfig,
        format!("{}/kubeconfig.conf", mount.mount_path)
    );
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&data["kubeconfig.conf"]).unwrap();
    let user = kubeconfig.auth_infos[0].auth_info.as_ref().unwrap();
    assert_eq!(
        user.token_file.as_deref(),
        Some("/var/run/secrets/kubernetes.io/serviceaccount/token")
    );
    let cluster = kubeconfig.clusters[0].cluster.as_ref().unwrap();
    assert!(cluster.server.as_deref().unwrap().starts_with("https://"));
    assert_eq!(
        cluster.certificate_authority.as_deref(),
        Some("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    );
}

#[test]
fn daemonset_runs_privileged_on_every_node_with_kubeadms_command_line() {
    let ds = daemonset();
    let spec = ds.spec;
    let selector = spec.selector.match_labels.unwrap();
    let labels = spec.template.metadata.clone().unwrap().labels.unwrap();
    for (key, value) in &selector {
        assert_eq!(
            labels.get(key),
            Some(value),
            "selector {key} matches the pods"
        );
    }
    let pod = spec.template.spec.clone().unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tolerations = pod.tolerations.unwrap();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "tolerates every taint"
    );

    let main = container(&spec.template);
    assert_eq!(
        main.security_context.unwrap().privileged,
        Some(true),
        "privileged"
    );
    assert_eq!(
        main.image.as_deref(),
        Some(format!("kube-proxy-rs:{}", env!("CARGO_PKG_VERSION")).as_str())
    );
    let command = main.command.clone().unwrap();
    assert_eq!(
        command,
        vec![
            "/usr/local/bin/kube-proxy",
            "--config=/var/lib/kube-proxy/config.conf",
            "--hostname-override=$(NODE_NAME)",
        ]
    );
    let env = main.env.clone().unwrap();
    let node_name = env.iter().find(|e| e.name == "NODE_NAME").unwrap();
    let field = node_name
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(field.field_path, "spec.nodeName");

    // Probes on the health server's port (healthzBindAddress defaults to 0.0.0.0:10256).
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    for (probe, path) in [
        (main.liveness_probe.clone(), "/livez"),
        (main.readiness_probe.clone(), "/healthz"),
    ] {
        let get = probe.unwrap().http_get.unwrap();
        assert_eq!(get.port, IntOrString::Int(10256));
        assert_eq!(get.path.as_deref(), Some(path));
    }
    let requests = main.resources.clone().unwrap().requests.unwrap();
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));

    // Mounts: the ConfigMap where --config points, the xtables lock, /lib/modules read-only.
    let volumes = pod.volumes.unwrap();
    let mounts = main.volume_mounts.clone().unwrap();
    let volume = |name: &str| volumes.iter().find(|v| v.name == name).unwrap().clone();
    let mount = |name: &str| mounts.iter().find(|m| m.name == name).unwrap().clone();
    let map: ConfigMap = parse("configmap.yaml");
    assert_eq!(
        volume("kube-proxy").config_map.unwrap().name,
        map.metadata.name.unwrap()
    );
    assert_eq!(mount("kube-proxy").mount_path, "/var/lib/kube-proxy");
    let lock = volume("xtables-lock").host_path.unwrap();
    assert_eq!(
        (lock.path.as_str(), lock.type_.as_deref()),
        ("/run/xtables.lock", Some("FileOrCreate"))
    );
    assert_eq!(mount("xtables-lock").mount_path, "/run/xtables.lock");
    assert_eq!(
        volume("lib-modules").host_path.unwrap().path,
        "/lib/modules"
    );
    assert_eq!(mount("lib-modules").read_only, Some(true));
}

#[test]
fn kubeadm_patch_swaps_image_and_command_of_kubeadms_container() {
    let patch: Value = parse("kubeadm/patch.yaml");
    let template: PodTemplateSpec =
        serde_yaml_ng::from_value(patch["spec"]["template"].clone()).unwrap();
    let patched = container(&template);
    // kubeadm names the container kube-proxy: a strategic merge patch matches it by name.
    assert_eq!(patched.name, "kube-proxy");
    let ours = container(&daemonset().spec.template);
    assert_eq!(patched.image, ours.image);
    assert_eq!(patched.command, ours.command);
    assert_eq!(patched.liveness_probe, ours.liveness_probe);
    assert_eq!(patched.readiness_probe, ours.readiness_probe);
}

#[test]
fn the_binary_accepts_kubeadms_command_line_and_config() {
    let map: ConfigMap = parse("configmap.yaml");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.conf");
    std::fs::write(&path, &map.data.unwrap()["config.conf"]).unwrap();
    let output = std::process::Command::new(BIN)
        .arg(format!("--config={}", path.display()))
        .arg("--hostname-override=node-a")
        .arg("print-config")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("mode: iptables"), "{printed}");
    assert!(
        printed.contains("healthzBindAddress: 0.0.0.0:10256"),
        "{printed}"
    );
}
