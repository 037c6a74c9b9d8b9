//! What each twin's node holds: the Services (the benchmarks' shared shape, N Services x 10
//! endpoints on another node, as ClusterIPs, and three measured Services whose one endpoint is
//! the server pod), programmed by the mode's proxier (nftables mode also with its flowtable
//! fast path; IPVS mode where the kernel has IPVS); upstream 1.37's nftables shape of the same
//! Services; or the floors' rules.

use std::net::IpAddr;

use kube_proxy_rs::config::KubeProxyConfiguration;
use kube_proxy_rs::model::{
    ChangeSummary, Endpoint, IpFamily, NamespacedName, Protocol, ProxyState, ServicePort,
    ServicePortName, VecMap,
};
use kube_proxy_rs::proxier::Proxier;
use kube_proxy_rs::proxier::iptables::IptablesProxier;
use kube_proxy_rs::proxier::ipvs::{IpvsProxier, IpvsSettings, check_support};
use kube_proxy_rs::proxier::nftables::flowtable::{self, FlowtableDevices};
use kube_proxy_rs::proxier::nftables::{NftablesProxier, NftablesSettings};
use kube_proxy_rs::sys::host::link::Links;
use kube_proxy_rs::sys::host::net::{FakeSysctl, FixedAddresses, ProcSysctl};
use kube_proxy_rs::sys::nf_tables::SystemNftables;
use kube_proxy_rs::sys::xtables::{Backend, SystemIptables, tool};

use crate::support::netns::Netns;
use crate::support::nft_files::{bare_nft, upstream_shaped};
use crate::support::scale::{self, NODE_IP};
use crate::topology::SERVER_POD_IP;
use crate::traffic::{STREAM_PORT, TCP_PORT, UDP_PORT};

/// The measured Services' ports: (name, protocol, port, target port, NodePort).
pub const PORTS: [(&str, Protocol, u16, u16, u16); 3] = [
    ("tcp", Protocol::Tcp, 80, TCP_PORT, 32710),
    ("dns", Protocol::Udp, 53, UDP_PORT, 32711),
    ("stream", Protocol::Tcp, 81, STREAM_PORT, 32712),
];

/// Where a measured Service sorts among the others (iptables mode walks KUBE-SERVICES in that
/// order; upstream's order is random, so its connections pay anywhere between first and last).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    First,
    Middle,
    Last,
}

impl Place {
    pub const ALL: [Place; 3] = [Place::First, Place::Middle, Place::Last];

    pub fn cluster_ip(self) -> IpAddr {
        let last = match self {
            Place::First => 1,
            Place::Middle => 2,
            Place::Last => 3,
        };
        IpAddr::from([172, 31, 0, last])
    }

    pub fn word(self) -> &'static str {
        match self {
            Place::First => "first",
            Place::Middle => "middle",
            Place::Last => "last",
        }
    }

    /// Its name: sorting before, among and after `bench/svc-0` .. `bench/svc-<count - 1>`.
    fn name(self, count: usize) -> NamespacedName {
        match self {
            Place::First => NamespacedName::new("aaa-first", "web"),
            Place::Last => NamespacedName::new("zzz-last", "web"),
            Place::Middle => {
                let mut names: Vec<String> = (0..count).map(|i| format!("svc-{i}")).collect();
                names.sort();
                let middle = names.get(count / 2).cloned().unwrap_or_default();
                NamespacedName::new("bench", format!("{middle}-middle"))
            }
        }
    }
}

/// `count` Services x 10 endpoints as ClusterIPs, and the three measured ones (only the middle
/// one has NodePorts).
pub fn state(count: usize) -> ProxyState {
    let mut state = scale::state(count);
    for ports in state.services.values_mut() {
        for port in ports.values_mut() {
            port.node_port = None;
        }
    }
    for place in Place::ALL {
        let key = place.name(count);
        let mut ports = Vec::new();
        let mut endpoints = Vec::new();
        for (port_name, protocol, port, target, node_port) in PORTS {
            let name = ServicePortName::new(&key.namespace, &key.name, port_name, protocol);
            let mut service_port = ServicePort::new(name.clone(), place.cluster_ip(), port);
            service_port.node_port = (place == Place::Middle).then_some(node_port);
            let server = SERVER_POD_IP.parse().expect("address");
            ports.push((name.clone(), service_port));
            endpoints.push((name, vec![Endpoint::ready(server, target, Some("node-a"))]));
        }
        state
            .services
            .insert(key.clone(), ports.into_iter().collect::<VecMap<_, _>>());
        state
            .endpoints
            .insert(key, endpoints.into_iter().collect::<VecMap<_, _>>());
    }
    state
}

/// The configuration every twin's proxier starts from.
fn config() -> KubeProxyConfiguration {
    scale::config("10.0.0.0/8")
}

/// nftables mode's proxier with `settings` in this thread's namespace, on the node's address.
fn nftables_proxier(settings: NftablesSettings) -> NftablesProxier<SystemNftables> {
    NftablesProxier::new(
        SystemNftables::default(),
        settings,
        Box::new(FixedAddresses(vec![NODE_IP.parse().expect("address")])),
    )
}

/// Programs `state` in `node` as nftables mode does; our table's text, for its upstream shape.
pub fn nftables(node: &Netns, state: ProxyState) -> String {
    node.run(move || {
        let mut p = nftables_proxier(NftablesSettings::from_config(&config()));
        p.record_transactions = true;
        p.sync(&state, &ChangeSummary::default())
            .expect("nftables sync");
        p.last_transactions.iter().map(|t| t.1.clone()).collect()
    })
}

/// Programs `state` in `node` as nftables mode does with `--offload-packet-threshold`, its
/// flowtable over the node's links; or why the kernel cannot (no flowtables).
pub fn nftables_offloading(node: &Netns, state: ProxyState, threshold: u32) -> Result<(), String> {
    node.run(move || {
        flowtable::probe(&mut SystemNftables::default())
            .map_err(|err| format!("this kernel has no flowtables (NF_FLOW_TABLE): {err}"))?;
        let links = Links::open().map_err(|err| err.to_string())?;
        let mut settings = NftablesSettings::from_config(&config());
        settings.offload_after_packets = Some(threshold);
        let mut p = nftables_proxier(settings)
            .with_flowtable_devices(FlowtableDevices::new(Box::new(links)));
        p.sync(&state, &ChangeSummary::default())
            .map(|_| ())
            .map_err(|err| err.to_string())
    })
}

/// Programs `state` in `node` as IPVS mode does (on iptables-nft); or why the kernel cannot
/// (this machine's has no IPVS: run it in the VM).
pub fn ipvs(node: &Netns, state: ProxyState) -> Result<(), String> {
    node.run(move || {
        let config = config();
        check_support(&config.ipvs.scheduler)
            .map_err(|err| format!("this kernel cannot run IPVS mode: {err}"))?;
        let mut p = IpvsProxier::new(
            IpvsSettings::from_config(&config),
            Box::new(SystemIptables::new(Backend::Nft)),
            Box::new(ProcSysctl::default()),
            Box::new(FixedAddresses(vec![NODE_IP.parse().expect("address")])),
        )
        .map_err(|err| err.to_string())?;
        p.sync(&state, &ChangeSummary::default())
            .map(|_| ())
            .map_err(|err| err.to_string())
    })
}

/// Programs upstream 1.37's shape of our table's `text` in `node`, as one `nft -f`.
pub fn upstream_nftables(node: &Netns, text: &str) {
    bare_nft(node, &upstream_shaped(text));
}

/// Programs `state` in `node` as iptables mode does on `backend`, and says where each measured
/// Service's rule sits in nat KUBE-SERVICES; or why the kernel refused it.
pub fn iptables(node: &Netns, state: ProxyState, backend: Backend) -> Result<String, String> {
    let count = state.services.len() - Place::ALL.len();
    node.run(move || {
        let mut p = IptablesProxier::new(
            SystemIptables::new(backend),
            scale::iptables_settings("10.0.0.0/8"),
            Box::new(FixedAddresses(vec![])),
            Box::new(FakeSysctl::default()),
        );
        p.sync(&state, &ChangeSummary::default())
            .map(|_| ())
            .map_err(|e| e.to_string())
    })?;
    let tool = tool(IpFamily::V4, backend, "");
    let chain = node.output(&[&tool, "-w", "5", "-t", "nat", "-S", "KUBE-SERVICES"]);
    let rules: Vec<&str> = chain.lines().filter(|l| l.starts_with("-A ")).collect();
    let places: Vec<String> = Place::ALL
        .iter()
        .map(|place| {
            let name = place.name(count);
            let wanted = format!("{}/{}:tcp cluster IP", name.namespace, name.name);
            let at = rules
                .iter()
                .position(|r| r.contains(&wanted))
                .expect("measured rule");
            format!("{} at rule {}", place.word(), at + 1)
        })
        .collect();
    Ok(format!(
        "KUBE-SERVICES holds {} rules; the measured Service {}",
        rules.len(),
        places.join(", ")
    ))
}

/// The third floor: the same translations as the mode's for the measured Service, each
/// written as one rule (DNAT of the ClusterIP's and the NodePorts' ports to the server pod;
/// masquerading, as kube-proxy's rules do, of ClusterIP traffic from outside the cluster CIDR
/// and of all NodePort traffic), and no other Service: what translating costs by itself.
pub fn translation(node: &Netns) {
    let ip = Place::Middle.cluster_ip();
    let mut dnat = String::new();
    for (_, protocol, port, target, node_port) in PORTS {
        let protocol = protocol.to_string().to_lowercase();
        dnat.push_str(&format!(
            "ip daddr {ip} {protocol} dport {port} dnat to {SERVER_POD_IP}:{target}; \
             ip daddr {NODE_IP} {protocol} dport {node_port} meta mark set 0x4000 dnat to {SERVER_POD_IP}:{target}; "
        ));
    }
    bare_nft(
        node,
        &format!(
            "table ip floor {{\n\
               chain translate {{ {dnat}}}\n\
               chain prerouting {{ type nat hook prerouting priority -100; jump translate; }}\n\
               chain output {{ type nat hook output priority -100; jump translate; }}\n\
               chain forward {{ type filter hook forward priority filter; ct state established,related accept; }}\n\
               chain postrouting {{ type nat hook postrouting priority 100; meta mark 0x4000 masquerade; ct status dnat ip saddr != 10.0.0.0/8 masquerade; ip saddr 10.200.0.0/16 ip daddr != 10.0.0.0/8 masquerade; }}\n\
             }}\n"
        ),
    );
}

/// The second floor: what any CNI's node has, connection tracking and a masquerade rule for
/// pods' traffic leaving the cluster, and no Services.
pub fn conntrack_and_masquerade(node: &Netns) {
    bare_nft(
        node,
        "table ip floor {\n\
           chain forward { type filter hook forward priority filter; ct state established,related accept; }\n\
           chain postrouting { type nat hook postrouting priority srcnat; ip saddr 10.200.0.0/16 ip daddr != 10.0.0.0/8 masquerade; }\n\
         }\n",
    );
}
