//! Rule and element text written straight into a `String`: addresses and numbers are most of
//! what a service's elements say (40 addresses per service of ten endpoints), and writing each
//! through `format!` and core's `Display`, a `String` per piece, was a third of a render.

use std::fmt::Write as _;
use std::net::IpAddr;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

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
