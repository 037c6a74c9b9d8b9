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

/// tests/testdata/ipvs/kernel-capture.txt: IPVS messages captured in the VM's kernel through an
/// nlmon tap (tests/ipvs_vm.rs writes it), as `label direction hex-after-the-netlink-header`.
/// Each message parsed, with its attribute bytes as the kernel saw them.
fn captured_raw(label: &str, direction: &str) -> Vec<(IpvsMessage, Vec<u8>)> {
    let capture = include_str!("../../../../tests/testdata/ipvs/kernel-capture.txt");
    capture
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let (l, d, hex) = (fields.next()?, fields.next()?, fields.next()?);
            (l == label && d == direction).then(|| {
                let raw: Vec<u8> = (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                    .collect();
                let header = GenlHeader {
                    cmd: raw[0],
                    version: raw[1],
                };
                let message = IpvsMessage::parse_with_param(&raw[4..], header).unwrap();
                (message, raw[4..].to_vec())
            })
        })
        .collect()
}

fn captured(label: &str, direction: &str) -> Vec<IpvsMessage> {
    captured_raw(label, direction)
        .into_iter()
        .map(|(message, _)| message)
        .collect()
}

/// The one request with command `cmd` captured under `label` (ipvsadm asks for GET_INFO first).
fn the_request(label: &str, cmd: u8) -> IpvsMessage {
    let mut requests: Vec<IpvsMessage> = captured(label, "request")
        .into_iter()
        .filter(|m| m.cmd == cmd)
        .collect();
    assert_eq!(requests.len(), 1, "{label}: one request captured");
    requests.remove(0)
}

fn web() -> VirtualServer {
    VirtualServer {
        flags: FLAG_PERSISTENT,
        timeout: 10800,
        ..vs("10.96.0.10", 80)
    }
}

fn dns() -> VirtualServer {
    VirtualServer {
        address: "fd00:10:96::10".parse().unwrap(),
        protocol: Protocol::Udp,
        port: 53,
        scheduler: "wrr".into(),
        flags: 0,
        timeout: 0,
    }
}

fn real(address: &str, port: u16, weight: u32) -> RealServer {
    RealServer::new(address.parse().unwrap(), port, weight)
}

#[test]
fn our_requests_are_byte_for_byte_what_the_kernel_received() {
    let cases = [
        ("add-web", service_message(CMD_NEW_SERVICE, &web())),
        ("add-dns", service_message(CMD_NEW_SERVICE, &dns())),
        (
            "add-web-real",
            dest_message(CMD_NEW_DEST, &web(), &real("10.244.1.5", 8080, 1)),
        ),
        (
            "add-dns-real",
            dest_message(CMD_NEW_DEST, &dns(), &real("fd00:10:244::5", 5353, 1)),
        ),
        (
            "drain-web-real",
            dest_message(CMD_SET_DEST, &web(), &real("10.244.1.5", 8080, 0)),
        ),
        ("list-services", list_services_message()),
        ("list-web-reals", list_dests_message(&web())),
        ("timeouts", timeouts_message(900, 120, 300)),
        (
            "delete-web-real",
            dest_message(CMD_DEL_DEST, &web(), &real("10.244.1.5", 8080, 0)),
        ),
        ("delete-dns", delete_service_message(&dns())),
    ];
    for (label, ours) in cases {
        let kernel: Vec<Vec<u8>> = captured_raw(label, "request")
            .into_iter()
            .filter(|(m, _)| m.cmd == ours.cmd)
            .map(|(_, raw)| raw)
            .collect();
        assert_eq!(kernel, vec![bytes(&ours)], "{label}: attributes differ");
    }
}

#[test]
fn the_kernels_replies_decode() {
    let mut services: Vec<VirtualServer> = captured("list-services", "reply")
        .iter()
        .filter_map(|m| decode_service(m).unwrap())
        .collect();
    services.sort();
    assert_eq!(services, vec![web(), dns()]);
    let reals = |label: &str, of: &VirtualServer| -> Vec<RealServer> {
        captured(label, "reply")
            .iter()
            .map(|m| decode_dest(m, &of.address).unwrap())
            .collect()
    };
    assert_eq!(
        reals("list-web-reals", &web()),
        vec![real("10.244.1.5", 8080, 0)]
    );
    assert_eq!(
        reals("list-dns-reals", &dns()),
        vec![real("fd00:10:244::5", 5353, 1)]
    );
    // Our fake replies carry the same attributes the kernel's do for what we read.
    let kernel = &captured("list-services", "reply")[0];
    assert_eq!(
        decode_service(&service_reply(&web())).unwrap(),
        decode_service(kernel).unwrap()
    );
}

#[test]
fn ipvsadms_requests_decode_to_what_it_was_asked() {
    let added = decode_service(&the_request("ipvsadm-add", CMD_NEW_SERVICE)).unwrap();
    assert_eq!(
        added,
        Some(VirtualServer {
            scheduler: "sh".into(),
            ..vs("10.96.0.11", 80)
        })
    );
    let add_real = the_request("ipvsadm-add-real", CMD_NEW_DEST);
    assert_eq!(
        decode_dest(&add_real, &"10.96.0.11".parse().unwrap()).unwrap(),
        real("10.244.1.7", 8080, 3)
    );
}
