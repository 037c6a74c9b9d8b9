//! The tracer on small rulesets written for it: each kernel rule it models, checked on its own.

use std::net::{IpAddr, SocketAddr};

use super::*;
use crate::model::{IpFamily, Protocol};
use crate::sys::nf_tables::Nftables;
use crate::sys::nf_tables::fake::FakeNftables;

const NODE: &str = "192.168.0.2";

fn ruleset(text: &str) -> Ruleset {
    let mut nft = FakeNftables::default();
    nft.apply(text).unwrap();
    Ruleset::from_fake(&nft, IpFamily::V4).unwrap()
}

fn packet(src: &str, dst: &str, dport: u16, from_node: bool) -> Packet {
    Packet {
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        sport: 40000,
        dport,
        protocol: Protocol::Tcp,
        from_node,
    }
}

fn run(text: &str, packet: &Packet) -> Vec<Path> {
    let local: Vec<IpAddr> = vec![NODE.parse().unwrap()];
    trace(&ruleset(text), &local, packet).unwrap()
}

fn endpoint(text: &str) -> Option<SocketAddr> {
    Some(text.parse().unwrap())
}

const NAT: &str = "add table ip t
add map ip t svcs { type ipv4_addr . inet_proto . inet_service : verdict ; }
add chain ip t pre { type nat hook prerouting priority -100 ; }
add chain ip t out { type nat hook output priority -100 ; }
add chain ip t post { type nat hook postrouting priority 100 ; }
add chain ip t svc
add rule ip t pre ip daddr . meta l4proto . th dport vmap @svcs
add rule ip t out ip daddr . meta l4proto . th dport vmap @svcs
add rule ip t post mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random
add element ip t svcs { 172.30.0.1 . tcp . 80 : goto svc }
";

#[test]
fn a_draw_is_followed_into_every_share_with_its_weight() {
    let text = format!(
        "{NAT}add map ip t eps {{ typeof numgen random mod 16384 : ip daddr . tcp dport ; flags interval ; }}
add rule ip t svc meta l4proto tcp dnat ip addr . port to numgen random mod 16384 offset 100 map @eps
add element ip t eps {{ 100-10099 : 10.0.0.1 . 8080 }}
add element ip t eps {{ 10100-16483 : 10.0.0.2 . 8080 }}
"
    );
    let paths = run(&text, &packet("10.1.0.5", "172.30.0.1", 80, false));
    let weights: Vec<(Option<SocketAddr>, f64)> =
        paths.iter().map(|p| (p.dnat, p.weight)).collect();
    assert_eq!(
        weights,
        [
            (endpoint("10.0.0.1:8080"), 10000.0 / 16384.0),
            (endpoint("10.0.0.2:8080"), 6384.0 / 16384.0)
        ]
    );
    assert!(
        paths
            .iter()
            .all(|p| p.fate == Fate::Accepted && !p.masquerade)
    );
}

#[test]
fn draws_no_share_holds_go_untranslated() {
    let text = format!(
        "{NAT}add map ip t eps {{ typeof numgen random mod 16384 : ip daddr . tcp dport ; flags interval ; }}
add rule ip t svc meta l4proto tcp dnat ip addr . port to numgen random mod 4 map @eps
add element ip t eps {{ 0-0 : 10.0.0.1 . 80 }}
"
    );
    let paths = run(&text, &packet("10.1.0.5", "172.30.0.1", 80, false));
    let weights: Vec<(Option<SocketAddr>, f64)> =
        paths.iter().map(|p| (p.dnat, p.weight)).collect();
    assert_eq!(weights, [(endpoint("10.0.0.1:80"), 0.25), (None, 0.75)]);
}

#[test]
fn a_mark_set_in_prerouting_is_masqueraded_in_postrouting() {
    let text = format!(
        "{NAT}add rule ip t svc ip saddr != 10.0.0.0/8 mark set mark or 0x4000
add rule ip t svc meta l4proto tcp dnat to 10.0.0.1:80
"
    );
    let outside = run(&text, &packet("203.0.113.2", "172.30.0.1", 80, false));
    assert_eq!(outside.len(), 1);
    assert!(outside[0].masquerade);
    assert_eq!(outside[0].dnat, endpoint("10.0.0.1:80"));
    let pod = run(&text, &packet("10.1.0.5", "172.30.0.1", 80, false));
    assert!(!pod[0].masquerade);
}

#[test]
fn nat_chains_after_a_translation_are_skipped() {
    let text = format!(
        "{NAT}add chain ip t later {{ type nat hook prerouting priority 50 ; }}
add rule ip t svc meta l4proto tcp dnat to 10.0.0.1:80
add rule ip t later meta l4proto tcp dnat to 10.0.0.9:80
"
    );
    let paths = run(&text, &packet("10.1.0.5", "172.30.0.1", 80, false));
    assert_eq!(paths[0].dnat, endpoint("10.0.0.1:80"));
    // Nothing translated it first: the later chain does.
    let other = run(&text, &packet("10.1.0.5", "172.30.0.2", 80, false));
    assert_eq!(other[0].dnat, endpoint("10.0.0.9:80"));
}

#[test]
fn jumps_return_and_gotos_do_not() {
    let text = "add table ip t
add chain ip t fwd { type filter hook forward priority 0 ; }
add chain ip t a
add chain ip t b
add rule ip t fwd tcp dport 80 jump a
add rule ip t fwd tcp dport 81 goto b
add rule ip t fwd ip saddr 10.1.0.0/16 drop
add rule ip t a return
add rule ip t a drop
add rule ip t b ip saddr 10.9.0.0/16 reject
";
    let fate = |port, src| run(text, &packet(src, "10.0.0.1", port, false))[0].fate;
    // Back from a, on to the drop.
    assert_eq!(fate(80, "10.1.0.5"), Fate::Dropped);
    // b falls off its end: back to fwd's caller, the hook, whose policy accepts.
    assert_eq!(fate(81, "10.1.0.5"), Fate::Accepted);
    assert_eq!(fate(81, "10.9.0.5"), Fate::Rejected);
    assert_eq!(fate(82, "10.2.0.5"), Fate::Accepted);
}

#[test]
fn the_node_reaches_its_own_address_through_input() {
    let text = "add table ip t
add chain ip t in { type filter hook input priority 0 ; }
add rule ip t in fib daddr type local tcp dport 22 reject
";
    let fate = |from_node| run(text, &packet(NODE, NODE, 22, from_node))[0].fate;
    assert_eq!(fate(true), Fate::Rejected);
    assert_eq!(fate(false), Fate::Rejected);
    // Forwarded elsewhere: never in input.
    assert_eq!(
        run(text, &packet("10.1.0.5", "10.0.0.1", 22, false))[0].fate,
        Fate::Accepted
    );
}

#[test]
fn what_it_does_not_model_is_an_error() {
    let text = "add table ip t
add chain ip t in { type filter hook input priority 0 ; }
add rule ip t in iifname \"eth0\" drop
";
    let local: Vec<IpAddr> = vec![NODE.parse().unwrap()];
    let result = trace(&ruleset(text), &local, &packet("10.1.0.5", NODE, 22, false));
    assert!(
        matches!(result, Err(TraceError::Unsupported(_))),
        "{result:?}"
    );
}
