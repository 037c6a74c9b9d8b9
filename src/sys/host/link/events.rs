//! Links appearing: a thread listens to rtnetlink's link group and calls back on each new or
//! changed link, so that what covers every link (nftables mode's flowtable) takes a new pod's
//! interface at once instead of at the next periodic sync.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::{Socket, SocketAddr};

use crate::sys::netlink::NetlinkError;

/// rtnetlink's multicast group of link changes (RTNLGRP_LINK).
const RTNLGRP_LINK: u32 = 1;
/// A link appeared or changed.
const RTM_NEWLINK: u16 = 16;

/// Listens while it lives.
pub struct LinkEvents {
    stop: Arc<AtomicBool>,
}

impl LinkEvents {
    /// Starts listening; `appeared` is called after each batch of messages that holds a new or
    /// changed link, and after lost events.
    pub fn start(appeared: Box<dyn Fn() + Send>) -> Result<LinkEvents, NetlinkError> {
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(NetlinkError::Socket)?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        socket
            .add_membership(RTNLGRP_LINK)
            .map_err(NetlinkError::Socket)?;
        use nix::sys::socket::{setsockopt, sockopt};
        // A timeout so the thread notices when it is no longer wanted.
        setsockopt(
            &socket,
            sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(1, 0),
        )
        .map_err(|e| NetlinkError::Socket(e.into()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::Builder::new()
            .name("link-events".into())
            .spawn(move || listen(&socket, &stopping, appeared.as_ref()))
            .map_err(NetlinkError::Socket)?;
        Ok(LinkEvents { stop })
    }
}

impl Drop for LinkEvents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn listen(socket: &Socket, stop: &AtomicBool, appeared: &dyn Fn()) {
    let mut buffer = Vec::with_capacity(64 * 1024);
    while !stop.load(Ordering::Relaxed) {
        buffer.clear();
        let received: Result<(usize, SocketAddr), std::io::Error> =
            socket.recv_from(&mut buffer, 0);
        match received {
            Ok(_) if holds_a_new_link(&buffer) => appeared(),
            Ok(_) => {}
            Err(err) if err.raw_os_error() == Some(nix::libc::ENOBUFS) => appeared(),
            // The receive timeout, so that `stop` is looked at.
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
            // Anything else would come back at once: wait rather than spin.
            Err(_) => std::thread::sleep(std::time::Duration::from_secs(1)),
        }
    }
}

/// Whether the messages in `buffer` include an RTM_NEWLINK (headers walked by their lengths;
/// a short or torn message ends the walk).
fn holds_a_new_link(buffer: &[u8]) -> bool {
    let mut offset = 0;
    while let Some(header) = buffer.get(offset..offset + 16) {
        let length = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let kind = u16::from_ne_bytes([header[4], header[5]]);
        if kind == RTM_NEWLINK {
            return true;
        }
        if length < 16 {
            return false;
        }
        offset += (length + 3) & !3;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, length: u32) -> Vec<u8> {
        let mut bytes = length.to_ne_bytes().to_vec();
        bytes.extend(kind.to_ne_bytes());
        bytes.resize(length as usize, 0);
        bytes
    }

    #[test]
    fn a_new_link_is_found_among_other_messages_and_torn_ones_end_the_walk() {
        let mut buffer = message(17, 20); // RTM_DELLINK
        buffer.extend(message(RTM_NEWLINK, 32));
        assert!(holds_a_new_link(&buffer));
        assert!(!holds_a_new_link(&message(17, 20)));
        assert!(!holds_a_new_link(&message(17, 4)));
        assert!(!holds_a_new_link(&[1, 2, 3]));
    }
}
