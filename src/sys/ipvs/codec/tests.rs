use netlink_packet_core::Emitable;

use super::*;

fn vs(address: &str, port: u16) -> VirtualServer {
    VirtualServer {
        address: address.parse().unwrap(),
        protocol: Protocol::Tcp,
        port,
        scheduler: "rr".into(),
        flags: 0,
        timeout: 0,
    }
}

fn bytes(message: &IpvsMessage) -> Vec<u8> {
    let mut buffer = vec![0u8; message.buffer_len()];
    message.emit(&mut buffer);
    buffer
}

#[test]
fn new_service_is_encoded_as_the_kernel_expects() {
    // 10.96.0.10:80/TCP, rr: AF u16, PROTOCOL u16, ADDR 4 bytes, PORT big-endian, "rr\0",
    // FLAGS {flags, mask ~0}, TIMEOUT, NETMASK 255.255.255.255; all in one nested SERVICE attribute.
    #[rustfmt::skip]
    let want: Vec<u8> = vec![
        0x48, 0x00, 0x01, 0x80,
        0x06, 0x00, 0x01, 0x00, 0x02, 0x00, 0x00, 0x00,
        0x06, 0x00, 0x02, 0x00, 0x06, 0x00, 0x00, 0x00,
        0x08, 0x00, 0x03, 0x00, 0x0a, 0x60, 0x00, 0x0a,
        0x06, 0x00, 0x04, 0x00, 0x00, 0x50, 0x00, 0x00,
        0x07, 0x00, 0x06, 0x00, b'r', b'r', 0x00, 0x00,
        0x0c, 0x00, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff,
        0x08, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x08, 0x00, 0x09, 0x00, 0xff, 0xff, 0xff, 0xff,
    ];
    assert_eq!(
        bytes(&service_message(CMD_NEW_SERVICE, &vs("10.96.0.10", 80))),
        want
    );
}

#[test]
fn ipv6_netmask_is_a_prefix_length_and_affinity_sets_persistence() {
    let mut v6 = vs("fd00::10", 443);
    v6.flags = FLAG_PERSISTENT;
    v6.timeout = 10800;
    let message = service_message(CMD_NEW_SERVICE, &v6);
    let inner = parse_attrs(&message.attrs[0].value).unwrap();
    assert_eq!(find(&inner, SVC_NETMASK), Some(&128u32.to_ne_bytes()[..]));
    assert_eq!(find(&inner, SVC_ADDR).map(<[u8]>::len), Some(16));
    assert_eq!(u32_ne(find(&inner, SVC_FLAGS)), Some(FLAG_PERSISTENT));
    assert_eq!(u32_ne(find(&inner, SVC_TIMEOUT)), Some(10800));
}

#[test]
fn kernel_replies_decode_with_hashed_stripped() {
    for (address, port) in [("10.96.0.10", 80), ("fd00:10:96::10", 8443)] {
        let mut want = vs(address, port);
        want.flags = FLAG_PERSISTENT;
        want.timeout = 600;
        let reply = service_reply(&want);
        let inner = parse_attrs(&reply.attrs[0].value).unwrap();
        assert_eq!(
            find(&inner, SVC_ADDR).map(<[u8]>::len),
            Some(16),
            "replies carry 16-byte addresses"
        );
        assert_eq!(decode_service(&reply).unwrap(), Some(want));
    }
}

#[test]
fn destinations_round_trip() {
    let service = vs("10.96.0.10", 80);
    let rs = RealServer {
        address: "10.244.1.5".parse().unwrap(),
        port: 8080,
        weight: 1,
        active_conns: 0,
        inactive_conns: 0,
    };
    let message = dest_message(CMD_NEW_DEST, &service, &rs);
    assert_eq!(message.attrs.len(), 2);
    let reply = IpvsMessage {
        cmd: CMD_NEW_DEST,
        attrs: vec![message.attrs[1].clone()],
    };
    assert_eq!(decode_dest(&reply, &service.address).unwrap(), rs);
    let inner = parse_attrs(&message.attrs[1].value).unwrap();
    assert_eq!(
        find(&inner, DEST_PORT),
        Some(&[0x1f, 0x90][..]),
        "port 8080 big-endian"
    );
    assert_eq!(u32_ne(find(&inner, DEST_FWD_METHOD)), Some(FWD_MASQ));
}

#[test]
fn malformed_replies_are_errors_not_panics() {
    assert!(
        decode_service(&IpvsMessage {
            cmd: CMD_NEW_SERVICE,
            attrs: vec![]
        })
        .is_err()
    );
    let truncated = IpvsMessage {
        cmd: CMD_NEW_SERVICE,
        attrs: vec![nest(ATTR_SERVICE, &[attr(SVC_ADDR, vec![1, 2])])],
    };
    assert!(decode_service(&truncated).is_err());
    let service = vs("10.96.0.10", 80);
    let bad_dest = IpvsMessage {
        cmd: CMD_NEW_DEST,
        attrs: vec![nest(ATTR_DEST, &[attr(DEST_ADDR, vec![1])])],
    };
    assert!(decode_dest(&bad_dest, &service.address).is_err());
    assert_eq!(service.key(), "10.96.0.10:80/TCP");
}
