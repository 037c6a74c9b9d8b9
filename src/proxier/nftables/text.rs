//! Rule and element text written straight into a `String`: addresses and numbers are most of
//! what a service's elements say (40 addresses per service of ten endpoints), and writing each
//! through `format!` and core's `Display`, a `String` per piece, was a third of a render. An
//! element's text is written into reused buffers ([`ElementText`]).

use std::fmt::Write as _;
use std::net::IpAddr;

use super::elements::Elements;

/// Appends `ip` as `Display` writes it.
pub fn push_ip(out: &mut String, ip: &IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            // Written on the stack, then appended at once.
            // Each octet's digits and a dot are copied as four bytes, and the length moves on
            // by as many as it has (room for the last one's spare bytes included).
            let mut text = [0u8; 19];
            let mut length = 0;
            for octet in v4.octets() {
                let [a, b, c, width] = DECIMAL[usize::from(octet)];
                let width = usize::from(width);
                let mut digits = [a, b, c, b'.'];
                digits[width] = b'.';
                text[length..length + 4].copy_from_slice(&digits);
                length += width + 1;
            }
            length -= 1;
            // Only ASCII digits and dots were written.
            out.push_str(std::str::from_utf8(&text[..length]).unwrap_or_default());
        }
        // Rare, and its shortest form (`::` runs) is Display's to get right.
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// Each byte's decimal digits, then how many there are.
const DECIMAL: [[u8; 4]; 256] = decimal_bytes();

const fn decimal_bytes() -> [[u8; 4]; 256] {
    let mut table = [[0u8; 4]; 256];
    let mut value = 0;
    while value < 256 {
        let (hundreds, tens, ones) = (
            (value / 100) as u8,
            (value / 10 % 10) as u8,
            (value % 10) as u8,
        );
        table[value] = if value >= 100 {
            [b'0' + hundreds, b'0' + tens, b'0' + ones, 3]
        } else if value >= 10 {
            [b'0' + tens, b'0' + ones, 0, 2]
        } else {
            [b'0' + ones, 0, 0, 1]
        };
        value += 1;
    }
    table
}

/// Appends `number` in decimal.
pub fn push_number(out: &mut String, number: impl itoa::Integer) {
    out.push_str(itoa::Buffer::new().format(number));
}

/// Appends `ip:port` (`[ip]:port` for IPv6), as `SocketAddr`'s `Display` writes it.
pub fn push_socket(out: &mut String, ip: &IpAddr, port: u16) {
    if ip.is_ipv6() {
        out.push('[');
        push_ip(out, ip);
        out.push(']');
    } else {
        push_ip(out, ip);
    }
    out.push(':');
    push_number(out, port);
}

/// The buffers an element's key and the rest of its text are written in, reused for every
/// element of a service, so that an element costs one allocation: its own.
#[derive(Default)]
pub struct ElementText {
    key: String,
    rest: String,
}

impl ElementText {
    /// Key `address` (the cluster-ips set's), rest empty.
    pub fn address_key(&mut self, address: &IpAddr) -> &mut Self {
        self.key.clear();
        push_ip(&mut self.key, address);
        self.rest.clear();
        self
    }

    /// Key `first-last` (draws of an endpoint map), rest ` : ip . port` (its endpoint).
    pub fn share(&mut self, first: u64, last: u64, ip: &IpAddr, port: u16) -> &mut Self {
        self.key.clear();
        push_number(&mut self.key, first);
        self.key.push('-');
        push_number(&mut self.key, last);
        self.rest.clear();
        self.rest.push_str(" : ");
        push_ip(&mut self.rest, ip);
        self.rest.push_str(" . ");
        push_number(&mut self.rest, port);
        self
    }

    /// Key `address . proto . port` (the service maps'), rest empty.
    pub fn service_key(&mut self, address: &IpAddr, proto: &str, port: u16) -> &mut Self {
        self.key.clear();
        push_service_key(&mut self.key, address, proto, port);
        self.rest.clear();
        self
    }

    /// Key `ip . ip . proto . port` (a connection of an endpoint to itself), rest empty.
    pub fn hairpin_key(&mut self, ip: &IpAddr, proto: &str, port: u16) -> &mut Self {
        self.key.clear();
        push_ip(&mut self.key, ip);
        self.key.push_str(" . ");
        push_service_key(&mut self.key, ip, proto, port);
        self.rest.clear();
        self
    }

    /// Key `proto . port` (the node-port maps'), rest empty.
    pub fn node_port_key(&mut self, proto: &str, port: u16) -> &mut Self {
        self.key.clear();
        self.key.push_str(proto);
        self.key.push_str(" . ");
        push_number(&mut self.key, port);
        self.rest.clear();
        self
    }

    /// The rest of the text: `parts` one after another.
    pub fn rest(&mut self, parts: &[&str]) -> &mut Self {
        self.rest.clear();
        for part in parts {
            self.rest.push_str(part);
        }
        self
    }

    /// Adds the element written to `elements`.
    pub fn add_into(&self, elements: &mut Elements) {
        elements.insert(&self.key, &self.rest);
    }
}

/// Appends `address . proto . port`.
fn push_service_key(out: &mut String, address: &IpAddr, proto: &str, port: u16) {
    push_ip(out, address);
    out.push_str(" . ");
    out.push_str(proto);
    out.push_str(" . ");
    push_number(out, port);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    #[test]
    fn element_text_is_written_as_nft_reads_it() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mut text = ElementText::default();
        let mut elements = Elements::default();
        text.address_key(&ip).add_into(&mut elements);
        text.service_key(&ip, "tcp", 80)
            .rest(&[" : goto ", "service-X"])
            .add_into(&mut elements);
        text.hairpin_key(&ip, "udp", 53).add_into(&mut elements);
        text.node_port_key("tcp", 30080).add_into(&mut elements);
        text.share(0, 4095, &ip, 8080).add_into(&mut elements);
        assert_eq!(
            elements.iter().collect::<Vec<_>>(),
            [
                ("0-4095", " : 10.0.0.1 . 8080"),
                ("10.0.0.1", ""),
                ("10.0.0.1 . 10.0.0.1 . udp . 53", ""),
                ("10.0.0.1 . tcp . 80", " : goto service-X"),
                ("tcp . 30080", ""),
            ]
        );
    }

    #[test]
    fn writes_what_display_writes() {
        for octet in 0..=255u8 {
            let ip = IpAddr::from([octet, 255 - octet, octet / 7, 10]);
            let mut out = String::new();
            push_ip(&mut out, &ip);
            assert_eq!(out, ip.to_string());
        }
        for text in [
            "0.0.0.0",
            "10.0.0.1",
            "255.255.255.255",
            "172.30.9.100",
            "::",
            "::1",
            "fd00::1:0:0:2",
            "2001:db8::ffff:10.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            let ip: IpAddr = text.parse().unwrap();
            let mut out = String::from("x");
            push_ip(&mut out, &ip);
            assert_eq!(out, format!("x{ip}"));
            for port in [0u16, 80, 65535] {
                let mut out = String::new();
                push_socket(&mut out, &ip, port);
                assert_eq!(out, SocketAddr::new(ip, port).to_string());
            }
        }
        let mut out = String::new();
        push_number(&mut out, 4_000_000_000u32);
        push_number(&mut out, 0u8);
        assert_eq!(out, "40000000000");
    }
}
