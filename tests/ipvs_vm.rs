//! IPVS against a real kernel: each test re-runs itself inside the VM (tests/vm/run-in-vm.sh boots
//! Debian's kernel, which has IPVS and dummy links), in a network namespace it creates there, and
//! checks what the kernel holds with ipvsadm and ip.

mod support;

use std::net::IpAddr;
use std::process::Command;

use kube_proxy_rs::model::Protocol;
use kube_proxy_rs::proxier::ipvs::{IpvsUnsupported, check_support};
use kube_proxy_rs::sys::host::link::Links;
use kube_proxy_rs::sys::ipvs::IpvsClient;
use kube_proxy_rs::sys::ipvs::codec::{CMD_DEL_DEST, CMD_NEW_DEST, CMD_SET_DEST, FLAG_PERSISTENT};
use support::netns::Netns;
use support::vm::{in_vm, rs, run_in_vm, text, vs};

#[test]
fn ipvs_client_against_the_kernel() {
    if !in_vm("ipvs_client_against_the_kernel") {
        return;
    }
    let ns = Netns::new("ipvs");
    let web = vs("10.96.0.10", Protocol::Tcp, 80, "rr");
    let dns = vs("fd00:10:96::10", Protocol::Udp, 53, "wrr");
    let (web2, dns2) = (web.clone(), dns.clone());
    ns.run(move || {
        let mut ipvs = IpvsClient::connect().expect("IPVS resolves in the VM");
        assert!(ipvs.services().unwrap().is_empty());
        ipvs.add_service(&web2).unwrap();
        ipvs.add_service(&dns2).unwrap();
        assert_eq!(
            ipvs.add_service(&web2).unwrap_err().errno(),
            Some(17),
            "EEXIST on a second add"
        );
        let mut listed = ipvs.services().unwrap();
        listed.sort();
        assert_eq!(listed, vec![web2.clone(), dns2.clone()]);
        ipvs.change_destination(CMD_NEW_DEST, &web2, &rs("10.244.1.5", 8080, 1))
            .unwrap();
        ipvs.change_destination(CMD_NEW_DEST, &web2, &rs("10.244.1.6", 8080, 1))
            .unwrap();
        ipvs.change_destination(CMD_NEW_DEST, &dns2, &rs("fd00:10:244::5", 5353, 1))
            .unwrap();
        ipvs.change_destination(CMD_SET_DEST, &web2, &rs("10.244.1.6", 8080, 0))
            .unwrap();
        let mut dests = ipvs.destinations(&web2).unwrap();
        dests.sort();
        assert_eq!(
            dests,
            vec![rs("10.244.1.5", 8080, 1), rs("10.244.1.6", 8080, 0)]
        );
        assert_eq!(
            ipvs.destinations(&dns2).unwrap(),
            vec![rs("fd00:10:244::5", 5353, 1)]
        );
        ipvs.set_timeouts(900, 120, 300).unwrap();
    });
    let listing = text(&ns, &["ipvsadm", "-Ln"]);
    for want in [
        "TCP  10.96.0.10:80 rr",
        "-> 10.244.1.5:8080",
        "Masq    1",
        "-> 10.244.1.6:8080",
        "Masq    0",
        "UDP  [fd00:10:96::10]:53 wrr",
        "-> [fd00:10:244::5]:5353",
    ] {
        assert!(
            listing.contains(want),
            "ipvsadm -Ln lacks {want:?}:\n{listing}"
        );
    }
    assert!(text(&ns, &["ipvsadm", "-L", "--timeout"]).contains("900 120 300"));

    // Persistence (ClientIP affinity) and a scheduler change through SET_SERVICE.
    let mut sticky = web.clone();
    sticky.scheduler = "sh".into();
    sticky.flags = FLAG_PERSISTENT;
    sticky.timeout = 600;
    let sticky2 = sticky.clone();
    ns.run(move || {
        let mut ipvs = IpvsClient::connect().unwrap();
        ipvs.update_service(&sticky2).unwrap();
        assert!(ipvs.services().unwrap().contains(&sticky2));
        ipvs.change_destination(CMD_DEL_DEST, &sticky2, &rs("10.244.1.6", 8080, 0))
            .unwrap();
        assert_eq!(ipvs.destinations(&sticky2).unwrap().len(), 1);
    });
    assert!(
        text(&ns, &["ipvsadm", "-Ln"]).contains("TCP  10.96.0.10:80 sh persistent 600"),
        "{}",
        text(&ns, &["ipvsadm", "-Ln"])
    );

    ns.run(move || {
        let mut ipvs = IpvsClient::connect().unwrap();
        ipvs.delete_service(&sticky).unwrap();
        ipvs.delete_service(&dns).unwrap();
        assert!(ipvs.services().unwrap().is_empty());
    });
    assert!(!text(&ns, &["ipvsadm", "-Ln"]).contains("10.96.0.10"));
}

#[test]
fn dummy_link_and_support_probe_in_the_kernel() {
    if !in_vm("dummy_link_and_support_probe_in_the_kernel") {
        return;
    }
    let ns = Netns::new("link");
    ns.run(|| {
        let mut links = Links::open().unwrap();
        let index = links.ensure_dummy("kube-ipvs0").unwrap();
        assert_eq!(
            links.ensure_dummy("kube-ipvs0").unwrap(),
            index,
            "idempotent"
        );
        let v4: IpAddr = "10.96.0.10".parse().unwrap();
        let v6: IpAddr = "fd00:10:96::10".parse().unwrap();
        links.add_address(index, v4).unwrap();
        links.add_address(index, v4).unwrap();
        links.add_address(index, v6).unwrap();
        assert_eq!(links.addresses(index).unwrap(), vec![v4, v6]);
    });
    let shown = text(&ns, &["ip", "addr", "show", "kube-ipvs0"]);
    assert!(
        shown.contains("10.96.0.10/32") && shown.contains("fd00:10:96::10/128"),
        "{shown}"
    );
    assert!(text(&ns, &["ip", "-d", "link", "show", "kube-ipvs0"]).contains("dummy"));
    ns.run(|| {
        let mut links = Links::open().unwrap();
        let index = links.index_of("kube-ipvs0").unwrap().unwrap();
        links
            .delete_address(index, "10.96.0.10".parse().unwrap())
            .unwrap();
        links
            .delete_address(index, "10.96.0.10".parse().unwrap())
            .unwrap();
        assert_eq!(
            links.addresses(index).unwrap(),
            vec!["fd00:10:96::10".parse::<IpAddr>().unwrap()]
        );
        assert!(links.delete("kube-ipvs0").unwrap());
        assert!(!links.delete("kube-ipvs0").unwrap());

        check_support("rr").expect("this kernel can run IPVS mode");
        check_support("").expect("empty scheduler means rr");
        match check_support("no-such-scheduler") {
            Err(IpvsUnsupported::Scheduler { scheduler, .. }) => {
                assert_eq!(scheduler, "no-such-scheduler")
            }
            other => panic!("want a scheduler error, got {other:?}"),
        }
        assert!(
            IpvsClient::connect()
                .unwrap()
                .services()
                .unwrap()
                .is_empty(),
            "the probe leaves nothing behind"
        );
        assert!(links.index_of("kprs-probe0").unwrap().is_none());
    });
}

/// The IPVS-mode iptables rules and ipsets for a scenario using every rule are accepted by the kernel.
#[test]
fn ipvs_mode_rules_and_sets_are_accepted_by_the_kernel() {
    if !in_vm("ipvs_mode_rules_and_sets_are_accepted_by_the_kernel") {
        return;
    }

    use kube_proxy_rs::model::{
        Endpoint, NamespacedName, NodeInfo, ProxyState, ServicePort, ServicePortName,
    };
    use kube_proxy_rs::proxier::context::FamilyContext;
    use kube_proxy_rs::proxier::ipvs::aggregate::render;
    use kube_proxy_rs::proxier::ipvs::render::IpvsContext;
    use kube_proxy_rs::proxier::local::LocalDetector;
    use kube_proxy_rs::sys::ipset::{SystemIpset, parse_save, sync_input};
    use kube_proxy_rs::sys::xtables::{Backend, Iptables, SystemIptables};

    let name = ServicePortName::new("ns", "lb", "http", Protocol::Tcp);
    let port = ServicePort {
        node_port: Some(30020),
        external_ips: vec![
            "192.168.50.1".parse().unwrap(),
            "192.168.50.2".parse().unwrap(),
        ],
        load_balancer_ips: vec!["5.6.7.8".parse().unwrap()],
        load_balancer_source_ranges: vec!["203.0.113.0/24".parse().unwrap()],
        ..ServicePort::new(name.clone(), "10.96.0.20".parse().unwrap(), 80)
    };
    // 0.0.0.0/0 is what many users write; ipset cannot store a /0.
    let open_name = ServicePortName::new("ns", "open", "http", Protocol::Tcp);
    let open_port = ServicePort {
        load_balancer_ips: vec!["5.6.7.9".parse().unwrap()],
        load_balancer_source_ranges: vec!["0.0.0.0/0".parse().unwrap()],
        ..ServicePort::new(open_name.clone(), "10.96.0.21".parse().unwrap(), 80)
    };
    let endpoint = Endpoint::ready("10.244.1.7".parse().unwrap(), 8080, Some("node-a"));
    let key = NamespacedName::new("ns", "lb");
    let mut state = ProxyState {
        node: NodeInfo {
            name: "node-a".into(),
            ..NodeInfo::default()
        },
        ..ProxyState::default()
    };
    state.services.insert(
        key.clone(),
        kube_proxy_rs::model::VecMap::from([(name.clone(), port)]),
    );
    state.endpoints.insert(
        key,
        kube_proxy_rs::model::VecMap::from([(name, vec![endpoint.clone()])]),
    );
    let open = NamespacedName::new("ns", "open");
    state.services.insert(
        open.clone(),
        kube_proxy_rs::model::VecMap::from([(open_name.clone(), open_port)]),
    );
    state.endpoints.insert(
        open,
        kube_proxy_rs::model::VecMap::from([(open_name, vec![endpoint])]),
    );
    let ctx = IpvsContext {
        common: FamilyContext {
            family: kube_proxy_rs::model::IpFamily::V4,
            node_name: "node-a".into(),
            zone: None,
            node_ip: Some("192.168.0.2".parse().unwrap()),
            masquerade_mark: 0x4000,
            masquerade_all: false,
            local_detector: LocalDetector::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
        },
        node_port_ips: vec!["192.168.0.2".parse().unwrap()],
        local_addresses: vec!["192.168.0.2".parse().unwrap()],
        scheduler: "rr".into(),
    };
    let desired = render(&state, &ctx);
    assert!(
        desired.iptables.contains("-m ipvs --vaddr 5.6.7.8")
            && desired.iptables.contains("-m physdev")
    );
    let ns = Netns::new("rules");
    ns.run(move || {
        let ipset = SystemIpset;
        let input = sync_input(&desired.sets, &parse_save(&ipset.save_sets(&[]).unwrap())).unwrap();
        ipset.restore(&input).unwrap();
        let mut iptables = SystemIptables::new(Backend::Nft);
        iptables
            .restore(kube_proxy_rs::model::IpFamily::V4, &desired.iptables)
            .expect("the kernel accepts IPVS mode's rules");
        let nat = String::from_utf8(
            std::process::Command::new("iptables-nft-save")
                .args(["-t", "nat"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        assert!(
            nat.contains("KUBE-LOAD-BALANCER") && nat.contains("match-set KUBE-CLUSTER-IP"),
            "{nat}"
        );
    });
}

/// A set entry the kernel refuses (here: a set of the same name another program created with
/// room for one element) is skipped with a warning and counted; the sync succeeds and every
/// virtual server is programmed.
#[test]
fn ipvs_a_refused_set_entry_does_not_fail_the_sync() {
    if !in_vm("ipvs_a_refused_set_entry_does_not_fail_the_sync") {
        return;
    }
    use kube_proxy_rs::model::ChangeSummary;
    use kube_proxy_rs::proxier::Proxier;

    let ns = Netns::new("ipvs-refused");
    ns.output(&[
        "ipset",
        "create",
        "KUBE-CLUSTER-IP",
        "hash:ip,port",
        "family",
        "inet",
        "maxelem",
        "1",
    ]);
    let state = support::scale::state(5);
    let report = ns.run(move || {
        support::scale::ipvs_proxier()
            .sync(&state, &ChangeSummary::default())
            .expect("the sync succeeds")
    });
    assert!(report.skipped_services >= 1, "{report:?}");
    let services = text(&ns, &["ipvsadm", "-Ln"]);
    for i in 0..5 {
        assert!(
            services.contains(&format!("172.30.0.{}:80", i + 1)),
            "svc-{i} programmed:\n{services}"
        );
    }
    let sets = text(&ns, &["ipset", "list", "KUBE-NODE-PORT-TCP"]);
    assert!(
        sets.contains("30004"),
        "the other sets were restored:\n{sets}"
    );
}

const CAPTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/testdata/ipvs/kernel-capture.txt"
);

/// Netlink traffic as the kernel sees it, through an nlmon tap in this thread's namespace.
struct NetlinkTap(std::os::fd::OwnedFd);

impl NetlinkTap {
    fn open() -> NetlinkTap {
        use nix::libc;
        use std::os::fd::FromRawFd;
        let status = Command::new("ip")
            .args(["link", "add", "nlmon0", "type", "nlmon"])
            .status()
            .unwrap();
        assert!(status.success(), "nlmon link");
        Command::new("ip")
            .args(["link", "set", "nlmon0", "up"])
            .status()
            .unwrap();
        let all = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket calls with a zeroed sockaddr_ll of the right size.
        unsafe {
            let fd = libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK,
                all as i32,
            );
            assert!(fd >= 0, "AF_PACKET socket");
            let mut address: libc::sockaddr_ll = std::mem::zeroed();
            address.sll_family = libc::AF_PACKET as u16;
            address.sll_protocol = all;
            address.sll_ifindex = libc::if_nametoindex(c"nlmon0".as_ptr()) as i32;
            let bound = libc::bind(
                fd,
                (&address as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(bound, 0, "bind to nlmon0");
            NetlinkTap(std::os::fd::OwnedFd::from_raw_fd(fd))
        }
    }

    /// The IPVS family's messages seen since the last call, as `direction cmd hex` lines (the hex
    /// is everything after the netlink header: the generic netlink header and the attributes).
    fn take(&self, family_id: u16, label: &str) -> Vec<String> {
        use std::os::fd::AsRawFd;
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut lines = Vec::new();
        let mut buffer = vec![0u8; 65536];
        loop {
            // SAFETY: reads into a buffer we own, of the length we pass.
            let n = unsafe {
                nix::libc::recv(
                    self.0.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    0,
                )
            };
            if n <= 0 {
                break;
            }
            let mut packet = &buffer[..n as usize];
            while packet.len() >= 16 {
                let length = u32::from_ne_bytes(packet[..4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes(packet[4..6].try_into().unwrap());
                let flags = u16::from_ne_bytes(packet[6..8].try_into().unwrap());
                if length < 16 || length > packet.len() {
                    break;
                }
                if kind == family_id {
                    let direction = if flags & 1 != 0 { "request" } else { "reply" };
                    let hex: String = packet[16..length]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    lines.push(format!("{label} {direction} {hex}"));
                }
                packet = &packet[(length + 3) & !3..];
            }
        }
        lines
    }
}

/// Captures, in the kernel, the IPVS messages our client sends and the kernel's answers (and
/// ipvsadm's requests, for a cross-check), and holds them to tests/testdata/ipvs/kernel-capture.txt,
/// which the codec's unit tests check byte for byte. UPDATE_GOLDEN=1 rewrites the file.
#[test]
fn ipvs_messages_match_the_kernel_capture() {
    if std::env::var_os("KPRS_IN_VM").is_none() {
        let log = run_in_vm("ipvs_messages_match_the_kernel_capture");
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            let capture = log
                .split("CAPTURE-BEGIN\n")
                .nth(1)
                .and_then(|rest| rest.split("CAPTURE-END").next())
                .expect("capture in the VM's output");
            std::fs::write(CAPTURE, capture).unwrap();
        }
        return;
    }
    let ns = Netns::new("capture");
    let captured = ns.run(|| {
        let tap = NetlinkTap::open();
        let mut ipvs = IpvsClient::connect().unwrap();
        let family_id = ipvs.family_id();
        let mut web = vs("10.96.0.10", Protocol::Tcp, 80, "rr");
        web.flags = FLAG_PERSISTENT;
        web.timeout = 10800;
        let dns = vs("fd00:10:96::10", Protocol::Udp, 53, "wrr");
        let mut lines = vec![];
        let mut step = |label: &str, f: &mut dyn FnMut(&mut IpvsClient)| {
            f(&mut ipvs);
            lines.extend(tap.take(family_id, label));
        };
        step("add-web", &mut |c| c.add_service(&web).unwrap());
        step("add-dns", &mut |c| c.add_service(&dns).unwrap());
        step("add-web-real", &mut |c| {
            c.change_destination(CMD_NEW_DEST, &web, &rs("10.244.1.5", 8080, 1))
                .unwrap()
        });
        step("add-dns-real", &mut |c| {
            c.change_destination(CMD_NEW_DEST, &dns, &rs("fd00:10:244::5", 5353, 1))
                .unwrap()
        });
        step("drain-web-real", &mut |c| {
            c.change_destination(CMD_SET_DEST, &web, &rs("10.244.1.5", 8080, 0))
                .unwrap()
        });
        step("list-services", &mut |c| {
            assert_eq!(c.services().unwrap().len(), 2)
        });
        step("list-web-reals", &mut |c| {
            assert_eq!(c.destinations(&web).unwrap().len(), 1)
        });
        step("list-dns-reals", &mut |c| {
            assert_eq!(c.destinations(&dns).unwrap().len(), 1)
        });
        step("timeouts", &mut |c| c.set_timeouts(900, 120, 300).unwrap());
        step("ipvsadm-add", &mut |_| {
            let ok = Command::new("ipvsadm")
                .args(["-A", "-t", "10.96.0.11:80", "-s", "sh"])
                .status()
                .unwrap();
            assert!(ok.success());
        });
        step("ipvsadm-add-real", &mut |_| {
            let ok = Command::new("ipvsadm")
                .args([
                    "-a",
                    "-t",
                    "10.96.0.11:80",
                    "-r",
                    "10.244.1.7:8080",
                    "-m",
                    "-w",
                    "3",
                ])
                .status()
                .unwrap();
            assert!(ok.success());
        });
        step("delete-web-real", &mut |c| {
            c.change_destination(CMD_DEL_DEST, &web, &rs("10.244.1.5", 8080, 0))
                .unwrap()
        });
        step("delete-dns", &mut |c| c.delete_service(&dns).unwrap());
        lines.join("\n") + "\n"
    });
    println!("CAPTURE-BEGIN\n{captured}CAPTURE-END");
    if std::env::var_os("UPDATE_GOLDEN").is_none() {
        // A dump lists services in hash order: compare the messages, not their order.
        let sorted = |text: &str| {
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            lines.sort();
            lines
        };
        let want = std::fs::read_to_string(CAPTURE).unwrap_or_default();
        assert_eq!(
            sorted(&captured),
            sorted(&want),
            "the kernel's messages differ from {CAPTURE} (UPDATE_GOLDEN=1 rewrites it)"
        );
    }
}
