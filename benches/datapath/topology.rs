//! One node's namespaces: the node (a router with the mode's rules, or none), a client pod and
//! a server pod on veth pairs, and a machine outside on the node's link. Every figure of the
//! benchmark is taken on such a twin, so that a floor and the mode differ only in their rules.

use std::net::SocketAddr;

use crate::support::netns::{Netns, attach_pod, uplink};
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
    /// The node's tracked connections are kept between rounds (IPVS: see `keep_connections`).
    keeps_connections: bool,
}

impl Twin {
    pub fn new(role: &str) -> Twin {
        let node = Netns::new(&format!("{role}-node"));
        let outside = Netns::new(&format!("{role}-out"));
        let client = Netns::new(&format!("{role}-cli"));
        let server = Netns::new(&format!("{role}-srv"));
        uplink(&node, NODE_IP, &outside, OUTSIDE_IP);
        attach_pod(&node, "vethc", &client, CLIENT_POD_IP, POD_GATEWAY);
        attach_pod(&node, "veths", &server, SERVER_POD_IP, POD_GATEWAY);
        let servers = Servers::start(&server);
        Twin {
            _servers: servers,
            node,
            outside,
            client,
            _server: server,
            keeps_connections: false,
        }
    }

    /// Keeps the node's tracked connections between rounds: IPVS keeps connections of its own
    /// (UDP for 300 s) that no flush of conntrack's reaches, so conntrack's are kept too and
    /// the two tables hold the same connections.
    pub fn keep_connections(&mut self) {
        self.keeps_connections = true;
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
        if !self.keeps_connections {
            let _ = self.node.raw_output(&["conntrack", "-F"]);
        }
    }
}

/// The server pod's address and a port on it.
pub fn server_pod(port: u16) -> SocketAddr {
    SocketAddr::new(SERVER_POD_IP.parse().expect("address"), port)
}
