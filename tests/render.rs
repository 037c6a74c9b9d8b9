//! `kube-proxy-rs render` as a user runs it: kubectl's YAML in, what would be programmed out,
//! with no root and no cluster; bad objects named on stderr while the rest still renders. Two
//! tests feed the output to the real iptables-restore and nft in a namespace.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use support::netns::{Netns, require_netns};

const BIN: &str = env!("CARGO_BIN_EXE_kube-proxy-rs");

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/render-input.yaml")
}

fn render(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(BIN)
        .arg("render")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The output compared with tests/golden/render/<name>.txt (`UPDATE_GOLDEN=1` rewrites it).
fn golden(name: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/render")
        .join(format!("{name}.txt"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text, want, "{name} differs from {}", path.display());
}

/// The example as a `---` stream of documents instead of a List.
fn as_document_stream() -> String {
    let text = std::fs::read_to_string(example()).unwrap();
    let list: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    list["items"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|item| serde_yaml_ng::to_string(item).unwrap())
        .collect::<Vec<_>>()
        .join("---\n")
}

#[test]
fn iptables_mode_prints_the_restore_input_of_a_first_sync() {
    let example = example();
    let output = render(
        &["--hostname-override=node-a", example.to_str().unwrap()],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    // Upstream's chain names for demo/web:http (TCP), the NodePort, both endpoints.
    for line in [
        "-A KUBE-SERVICES -m comment --comment \"demo/web:http cluster IP\" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-XRY76EGRC3BSCIIJ",
        "-A KUBE-NODEPORTS -m comment --comment demo/web:http -m tcp -p tcp --dport 30080 -j KUBE-EXT-XRY76EGRC3BSCIIJ",
        "-j DNAT --to-destination 10.244.1.11:8080",
        "-j DNAT --to-destination 10.244.2.21:8080",
        "-j DNAT --to-destination 10.244.1.12:5353",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    golden("iptables", &text);
}

#[test]
fn ipvs_mode_prints_virtual_servers_addresses_sets_and_rules() {
    let example = example();
    let output = render(
        &[
            "--hostname-override=node-a",
            "--proxy-mode=ipvs",
            example.to_str().unwrap(),
        ],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    for line in [
        "TCP  10.96.0.10:80 rr",
        "UDP  10.96.0.53:53 rr",
        // The NodePort on the Node's InternalIP.
        "TCP  192.168.1.10:30080 rr",
        "  -> 10.244.2.21:8080             Masq    1      0          0",
        "10.96.0.53/32",
        "KUBE-CLUSTER-IP (hash:ip,port): 10.96.0.10,tcp:80 10.96.0.53,udp:53",
        "KUBE-NODE-PORT-TCP (bitmap:port): 30080",
        "-t nat -I PREROUTING 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    golden("ipvs", &text);
}

#[test]
fn lists_document_streams_and_stdin_render_the_same() {
    let example = example();
    let from_list = render(
        &["--hostname-override=node-a", example.to_str().unwrap()],
        None,
    );
    let from_stdin = render(
        &["--hostname-override=node-a", "-"],
        Some(&as_document_stream()),
    );
    assert!(from_stdin.status.success(), "{}", stderr(&from_stdin));
    assert_eq!(stdout(&from_list), stdout(&from_stdin));
}

#[test]
fn proxy_mode_flag_wins_over_the_config_files_mode() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n",
    )
    .unwrap();
    let example = example();
    let args = |extra: &[&'static str]| {
        let mut args = vec![
            format!("--config={}", config.display()),
            "--hostname-override=node-a".to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.push(example.display().to_string());
        args
    };
    let ipvs = render(
        &args(&[]).iter().map(String::as_str).collect::<Vec<_>>(),
        None,
    );
    assert!(stdout(&ipvs).contains("mode ipvs"), "{}", stdout(&ipvs));
    let iptables = render(
        &args(&["--proxy-mode=iptables"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        None,
    );
    assert!(stdout(&iptables).contains("*nat"), "{}", stdout(&iptables));
}

/// A node started with flags and no file programs what those flags say; `render` given the same
/// flags prints the same (the daemon's parser and precedence).
#[test]
fn flags_that_shape_the_rules_shape_what_render_prints() {
    let example = example().display().to_string();
    let plain = stdout(&render(&["--hostname-override=node-a", &example], None));
    let shaped = stdout(&render(
        &[
            "--hostname-override=node-a",
            "--masquerade-all",
            "--iptables-masquerade-bit=12",
            &example,
        ],
        None,
    ));
    assert_ne!(plain, shaped);
    assert!(
        shaped.contains("-j MARK --or-mark 0x1000"),
        "masquerade bit 12: {shaped}"
    );
    let detected = stdout(&render(
        &[
            "--hostname-override=node-a",
            "--cluster-cidr=10.244.0.0/16",
            &example,
        ],
        None,
    ));
    assert!(
        detected.contains("! -s 10.244.0.0/16"),
        "the cluster CIDR tells pods from the rest: {detected}"
    );
    assert!(!plain.contains("10.244.0.0/16"), "{plain}");
    let unknown = render(
        &["--hostname-override=node-a", "--no-such-flag", &example],
        None,
    );
    assert_eq!(unknown.status.code(), Some(1));
}

/// With AllowServiceExternalIPs off, a Service's external IP gets no rule (here: the REJECT of
/// a Service without endpoints).
#[test]
fn external_ips_follow_their_feature_gate() {
    let objects = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\n\
        spec: {clusterIP: 10.96.0.10, clusterIPs: [10.96.0.10], externalIPs: [192.0.2.7],\n\
        ports: [{name: http, port: 80, protocol: TCP}]}\n";
    let rendered = |gates: &[&str]| {
        let mut args = vec!["--hostname-override=node-a"];
        args.extend_from_slice(gates);
        args.push("-");
        stdout(&render(&args, Some(objects)))
    };
    assert!(rendered(&[]).contains("-d 192.0.2.7"), "{}", rendered(&[]));
    let off = rendered(&["--feature-gates=AllowServiceExternalIPs=false"]);
    assert!(off.contains("10.96.0.10"), "{off}");
    assert!(!off.contains("192.0.2.7"), "{off}");
}

#[test]
fn bad_objects_are_named_and_the_rest_still_renders() {
    let input = "\
apiVersion: v1
kind: Service
metadata: {name: bad-port, namespace: demo}
spec:
  clusterIP: 10.96.0.20
  ports: [{port: eighty, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: bad-ip, namespace: demo}
spec:
  clusterIP: 10.96.0.300
  clusterIPs: [10.96.0.300]
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: good, namespace: demo}
spec:
  clusterIP: 10.96.0.21
  clusterIPs: [10.96.0.21]
  ports: [{name: http, port: 80}]
";
    let output = render(&["--hostname-override=node-a", "-"], Some(input));
    assert_eq!(output.status.code(), Some(1), "bad input is an error");
    let errors = stderr(&output);
    assert!(
        errors.contains("document 1 (Service demo/bad-port): spec.ports[0].port: invalid type"),
        "{errors}"
    );
    assert!(
        errors.contains("document 2 (Service demo/bad-ip): spec.clusterIPs: \"10.96.0.300\""),
        "{errors}"
    );
    let text = stdout(&output);
    assert!(text.contains("demo/good:http"), "{text}");
    assert!(!text.contains("bad-"), "{text}");

    let unreadable = render(&["/nonexistent/objects.yaml"], None);
    assert_eq!(unreadable.status.code(), Some(1));
    assert!(stderr(&unreadable).contains("/nonexistent/objects.yaml"));
    let not_yaml = render(&["-"], Some("items: [\n"));
    assert_eq!(not_yaml.status.code(), Some(1));
    assert!(
        stderr(&not_yaml).contains("-: document 1: not YAML"),
        "{}",
        stderr(&not_yaml)
    );
    let bad_mode = render(&["--proxy-mode=bogus", "-"], Some(""));
    assert_eq!(bad_mode.status.code(), Some(64));
    assert!(stderr(&bad_mode).contains("mode: invalid value \"bogus\""));
}

#[test]
fn the_kernel_accepts_what_render_prints() {
    require_netns();
    let example = example();
    let output = render(
        &["--hostname-override=node-a", example.to_str().unwrap()],
        None,
    );
    let restore: String = stdout(&output)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let ns = Netns::new("render");
    let applied = ns.run(move || {
        let mut child = Command::new("iptables-nft-restore")
            .args(["-w", "5", "--noflush"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(restore.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    });
    assert!(applied.status.success(), "{}", stderr(&applied));
    let saved = ns.output(&["iptables-nft-save", "-t", "nat"]);
    assert!(saved.contains("-j KUBE-SVC-XRY76EGRC3BSCIIJ"), "{saved}");
}

/// nftables mode: `render` prints `nft -f` input that nft and the kernel accept, and the table
/// it makes DNATs each service through its slot of an endpoint map holding its endpoints.
#[test]
fn nftables_mode_prints_what_nft_applies() {
    require_netns();
    let example = example();
    let output = render(
        &[
            "--proxy-mode=nftables",
            "--hostname-override=node-a",
            example.to_str().unwrap(),
        ],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("# nft -f input (IPv4)"), "{text}");
    let ns = Netns::new("render-nft");
    let path = std::env::temp_dir().join(format!("kprs-render-{}.nft", std::process::id()));
    std::fs::write(&path, &text).unwrap();
    ns.exec(&["nft", "-f", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    let table = ns.output(&["nft", "list", "table", "ip", "kube-proxy"]);
    let rule = table
        .lines()
        .find(|l| l.contains("numgen random mod 16384 offset"))
        .unwrap_or_else(|| panic!("no DNAT through an endpoint map in\n{table}"));
    let map = rule
        .split_whitespace()
        .find_map(|w| w.strip_prefix('@'))
        .unwrap();
    let elements = ns.output(&["nft", "list", "map", "ip", "kube-proxy", map]);
    assert!(elements.contains(" : 10.244."), "{elements}");
}

/// The blocks of an `nft list table` output: each set's, map's and chain's header line and its
/// lines, with `elements = { ... }` split into a sorted list of elements and our digest
/// comments taken out.
fn listed_blocks(listing: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut blocks = std::collections::BTreeMap::new();
    let mut current: Option<(String, Vec<String>)> = None;
    let mut elements: Option<String> = None;
    for line in listing.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(open) = elements.as_mut() {
            open.push(' ');
            open.push_str(line);
        } else if ["set ", "map ", "chain "]
            .iter()
            .any(|k| line.starts_with(k))
        {
            current = Some((line.to_string(), Vec::new()));
            continue;
        } else if line == "}" {
            if let Some((name, lines)) = current.take() {
                blocks.insert(name, lines);
            }
            continue;
        } else if line.starts_with("elements = {") {
            elements = Some(line.to_string());
        } else if let Some((_, lines)) = current.as_mut() {
            let line = match line.find(" comment \"kube-proxy-rs:") {
                Some(at) => &line[..at],
                None => line,
            };
            lines.push(line.to_string());
            continue;
        }
        if let Some(open) = elements.as_ref().filter(|e| e.ends_with('}')) {
            let inner = open
                .trim_start_matches("elements = {")
                .trim_end_matches('}');
            let mut items: Vec<String> = inner.split(',').map(|e| e.trim().to_string()).collect();
            items.sort();
            if let Some((_, lines)) = current.as_mut() {
                lines.extend(items.into_iter().map(|e| format!("element {e}")));
            }
            elements = None;
        }
    }
    blocks
}

/// nftables mode against a live upstream 1.36.2 node's table (tests/upstream/nftables/
/// live-1.36.2/): the same cluster rendered, applied with nft and listed the same way lists
/// the blocks that node listed, line for line.
#[test]
fn nftables_mode_lists_each_block_as_a_live_1_36_node_does() {
    require_netns();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/nftables/live-1.36.2");
    let objects = dir.join("objects.yaml");
    let output = render(
        &[
            "--proxy-mode=nftables",
            "--hostname-override=pi",
            "--cluster-cidr=10.244.0.0/16",
            objects.to_str().unwrap(),
        ],
        None,
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let ns = Netns::new("render-live");
    let path = std::env::temp_dir().join(format!("kprs-live-{}.nft", std::process::id()));
    std::fs::write(&path, stdout(&output)).unwrap();
    ns.exec(&["nft", "-f", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    let ours = listed_blocks(&ns.output(&["nft", "list", "table", "ip", "kube-proxy"]));
    let upstream = listed_blocks(&std::fs::read_to_string(dir.join("listed.nft")).unwrap());
    assert_eq!(upstream.len(), 6, "{upstream:?}");
    for (block, lines) in &upstream {
        assert_eq!(ours.get(block), Some(lines), "{block}\nours: {ours:#?}");
    }
}
