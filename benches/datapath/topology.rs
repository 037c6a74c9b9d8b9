//! One node's namespaces: the node (a router with the mode's rules, or none), a client pod and
//! a server pod on veth pairs, and a machine outside on the node's link. Every figure of the
//! benchmark is taken on such a twin, so that a floor and the mode differ only in their rules.

use std::net::SocketAddr;

use crate::support::netns::{Netns, veth};
use crate::support::scale::NODE_IP;
use crate::traffic::Servers;

pub const OUTSIDE_IP: &str = "192.168.0.1";
pub const CLIENT_POD_IP: &str = "10.200.0.11";
pub const SERVER_POD_IP: &str = "10.200.0.21";
const POD_GATEWAY: &str = "10.200.0.1";

/// Where a connection starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Pod,
    Node,
    Outside,
}

/// One node's namespaces with the server pod's servers running. (The servers come first:
/// fields drop in order, and they stop before their namespace goes.)
pub struct Twin {
    _servers: Servers,
    pub node: Netns,
    pub outside: Netns,
    pub client: Netns,
    _server: Netns,
}

impl Twin {
    pub fn new(role: &str) -> Twin {
        let node = Netns::new(&format!("{role}-node"));
        let outside = Netns::new(&format!("{role}-out"));
        let client = Netns::new(&format!("{role}-cli"));
        let server = Netns::new(&format!("{role}-srv"));
        node.sysctl("net.ipv4.ip_forward", "1");
        veth(&node, "eth0", &outside, "eth0");
        node.exec(&["ip", "addr", "add", &format!("{NODE_IP}/24"), "dev", "eth0"]);
        outside.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{OUTSIDE_IP}/24"),
            "dev",
            "eth0",
        ]);
        outside.exec(&["ip", "route", "add", "default", "via", NODE_IP]);
        // The node's own connections need a route before nat OUTPUT sees them; it points at
        // the outside namespace, so nothing leaves the twin.
        node.exec(&["ip", "route", "add", "default", "via", OUTSIDE_IP]);
        for (pod, ip, link) in [
            (&client, CLIENT_POD_IP, "vethc"),
            (&server, SERVER_POD_IP, "veths"),
        ] {
            veth(&node, link, pod, "eth0");
            node.exec(&[
                "ip",
                "addr",
                "add",
                &format!("{POD_GATEWAY}/32"),
                "dev",
                link,
            ]);
            node.exec(&["ip", "route", "add", &format!("{ip}/32"), "dev", link]);
            pod.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "eth0"]);
            pod.exec(&["ip", "route", "add", POD_GATEWAY, "dev", "eth0"]);
            pod.exec(&["ip", "route", "add", "default", "via", POD_GATEWAY]);
        }
        let servers = Servers::start(&server);
        Twin {
            _servers: servers,
            node,
            outside,
            client,
            _server: server,
        }
    }

    /// The namespace a connection from `origin` starts in.
    pub fn origin(&self, origin: Origin) -> &Netns {
        match origin {
            Origin::Pod => &self.client,
            Origin::Node => &self.node,
            Origin::Outside => &self.outside,
        }
    }

    /// Forgets the node's tracked connections, so that no round meets the last one's entries.
    pub fn forget_connections(&self) {
        let _ = self.node.raw_output(&["conntrack", "-F"]);
    }
}

/// The server pod's address and a port on it.
pub fn server_pod(port: u16) -> SocketAddr {
    SocketAddr::new(SERVER_POD_IP.parse().expect("address"), port)
}
