//! The statements that match packets: conntrack state, protocols and ports, interfaces, the
//! address type, addresses (one, a prefix, a set, an anonymous interval set), concatenations
//! looked up in a set or verdict map, and the packet mark.

use std::net::IpAddr;

use super::*;

impl<'a> Builder<'_, 'a> {
    /// `ct state new`, `ct status dnat`, `ct original ... daddr @SET` and `ct packets > N`.
    pub(super) fn conntrack(&mut self) -> Result<(), Unsupported> {
        match self.peek() {
            Some("original") => return self.conntrack_original(),
            Some("packets") => return self.conntrack_packets(),
            _ => {}
        }
        let (key, bit) = match (self.next()?, self.next()?) {
            ("state", "new") => (CT_STATE, CT_STATE_NEW),
            ("status", "dnat") => (CT_STATUS, CT_STATUS_DNAT),
            (key, value) => return Err(format!("unsupported ct match {key} {value}")),
        };
        self.emit(Expr::Ct { key, dreg: REG_1 });
        self.emit(Expr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            mask: bit.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
            boolean_op: false,
        });
        self.emit(Expr::Cmp {
            sreg: REG_1,
            op: CMP_NEQ,
            data: vec![0; 4],
        });
        Ok(())
    }

    /// `ct original ip daddr @SET`: the destination the connection was opened to, before DNAT.
    fn conntrack_original(&mut self) -> Result<(), Unsupported> {
        self.expect("original")?;
        self.expect(self.address_family_word())?;
        self.expect("daddr")?;
        let set = self.reference()?;
        let key = if self.ipv6 { CT_DST_IP6 } else { CT_DST_IP };
        self.emit(Expr::CtOriginal { key, dreg: REG_1 });
        self.lookup_in(set, None, false);
        Ok(())
    }

    /// `ct packets > N`: the connection's packets, both directions, compared in network order.
    fn conntrack_packets(&mut self) -> Result<(), Unsupported> {
        self.expect("packets")?;
        self.expect(">")?;
        let count: u64 = self.number("a packet count")?;
        self.emit(Expr::Ct {
            key: CT_PACKETS,
            dreg: REG_1,
        });
        self.emit(Expr::HostToNetwork64 { reg: REG_1 });
        self.emit(Expr::Cmp {
            sreg: REG_1,
            op: CMP_GT,
            data: count.to_be_bytes().to_vec(),
        });
        Ok(())
    }

    /// `meta l4proto PROTO`, or the start of a concatenation.
    pub(super) fn meta(&mut self) -> Result<(), Unsupported> {
        self.expect("l4proto")?;
        if self.peek() == Some(".") {
            self.l4_concatenation(0)?;
        } else {
            let protocol = values::protocol(self.next()?)?;
            self.emit(Expr::MetaLoad {
                key: META_L4PROTO,
                dreg: REG_1,
            });
            self.emit(Expr::Cmp {
                sreg: REG_1,
                op: CMP_EQ,
                data: vec![protocol],
            });
        }
        Ok(())
    }

    /// `tcp|udp|sctp dport PORT` (`word` the protocol).
    pub(super) fn transport_port(&mut self, word: &str) -> Result<(), Unsupported> {
        self.expect("dport")?;
        let port: u16 = self.number("a port")?;
        self.emit(Expr::MetaLoad {
            key: META_L4PROTO,
            dreg: REG_1,
        });
        self.emit(Expr::Cmp {
            sreg: REG_1,
            op: CMP_EQ,
            data: vec![values::protocol(word)?],
        });
        self.emit(Expr::Payload {
            dreg: REG_1,
            base: BASE_TRANSPORT,
            offset: 2,
            len: 2,
        });
        self.emit(Expr::Cmp {
            sreg: REG_1,
            op: CMP_EQ,
            data: port.to_be_bytes().to_vec(),
        });
        Ok(())
    }

    /// `iifname [!=] "NAME"`, a trailing `*` matching a prefix.
    pub(super) fn iifname(&mut self) -> Result<(), Unsupported> {
        let op = self.operator();
        let name = unquote(self.next()?)?;
        let data = match name.strip_suffix('*') {
            Some(prefix) => prefix.as_bytes().to_vec(),
            None => {
                let mut bytes = name.as_bytes().to_vec();
                if bytes.len() >= IFNAMSIZ {
                    return Err("interface name too long".into());
                }
                bytes.resize(IFNAMSIZ, 0);
                bytes
            }
        };
        if data.is_empty() {
            return Err("an empty interface name".into());
        }
        self.emit(Expr::MetaLoad {
            key: META_IIFNAME,
            dreg: REG_1,
        });
        self.emit(Expr::Cmp {
            sreg: REG_1,
            op,
            data,
        });
        Ok(())
    }

    /// `fib saddr|daddr type local`.
    pub(super) fn fib(&mut self) -> Result<(), Unsupported> {
        let source = match self.next()? {
            "saddr" => true,
            "daddr" => false,
            other => return Err(format!("unsupported fib key {other:?}")),
        };
        self.expect("type")?;
        self.expect("local")?;
        self.emit(Expr::FibAddressType {
            dreg: REG_1,
            source,
        });
        // RTN_LOCAL, in host order.
        self.emit(Expr::Cmp {
            sreg: REG_1,
            op: CMP_EQ,
            data: 2u32.to_ne_bytes().to_vec(),
        });
        Ok(())
    }

    /// `!=` (consumed) or equality.
    pub(super) fn operator(&mut self) -> u32 {
        if self.peek() == Some("!=") {
            self.position += 1;
            CMP_NEQ
        } else {
            CMP_EQ
        }
    }

    /// `ip daddr|saddr ...` after the family word.
    pub(super) fn address_statement(&mut self) -> Result<(), Unsupported> {
        let source = match self.next()? {
            "saddr" => true,
            "daddr" => false,
            other => return Err(format!("unsupported address key {other:?}")),
        };
        let (_, length) = self.address_field(source);
        if self.peek() == Some(".") {
            self.load_address(source, REG_1, length);
            return self.l4_concatenation(length as usize);
        }
        let op = self.operator();
        let value = self.next()?;
        if let Some(set) = value.strip_prefix('@') {
            self.load_address(source, REG_1, length);
            self.lookup_in(set, None, op == CMP_NEQ);
            return Ok(());
        }
        let matches = if value == "{" {
            let mut matches = Vec::new();
            loop {
                let word = self.next()?;
                if word == "}" {
                    break;
                }
                matches.push(AddressMatch::parse(word.trim_end_matches(','))?);
            }
            matches
        } else {
            vec![AddressMatch::parse(value)?]
        };
        for matched in &matches {
            check_family(matched, self.ipv6)?;
        }
        match matches.as_slice() {
            [] => Err("an empty set".into()),
            [single] => self.match_one(source, op, *single),
            several if several.iter().any(|m| matches!(m, AddressMatch::Prefix(_))) => {
                self.load_address(source, REG_1, length);
                self.out
                    .exprs
                    .push(Part::AnonymousSet(AnonymousSet::Addresses {
                        matches: several.to_vec(),
                        source,
                        sreg: REG_1,
                        inverted: op == CMP_NEQ,
                    }));
                Ok(())
            }
            _ => Err("a set of plain addresses".into()),
        }
    }

    /// One address or prefix: loaded and compared, a prefix on whole bytes by loading only
    /// those, otherwise masked.
    pub(super) fn match_one(
        &mut self,
        source: bool,
        op: u32,
        matched: AddressMatch,
    ) -> Result<(), Unsupported> {
        let (_, length) = self.address_field(source);
        match matched {
            AddressMatch::Address(address) => {
                self.load_address(source, REG_1, length);
                self.emit(Expr::Cmp {
                    sreg: REG_1,
                    op,
                    data: values::address_bytes(address),
                });
            }
            AddressMatch::Prefix(net) => {
                let bits = net.prefix_len() as u32;
                if bits == 0 {
                    return Err("a match of every address".into());
                }
                let bytes = values::address_bytes(net.network());
                if bits.is_multiple_of(8) {
                    let used = (bits / 8) as usize;
                    self.load_address(source, REG_1, used as u32);
                    self.emit(Expr::Cmp {
                        sreg: REG_1,
                        op,
                        data: bytes[..used].to_vec(),
                    });
                } else {
                    self.load_address(source, REG_1, length);
                    let mask = values::address_bytes(prefix_mask(net.addr(), bits));
                    self.emit(Expr::Bitwise {
                        sreg: REG_1,
                        dreg: REG_1,
                        mask,
                        xor: vec![0; length as usize],
                        boolean_op: false,
                    });
                    self.emit(Expr::Cmp {
                        sreg: REG_1,
                        op,
                        data: bytes,
                    });
                }
            }
        }
        Ok(())
    }

    /// `[ADDRESS . [ADDRESS .]] meta l4proto . th dport vmap @MAP` or `... @SET`, the first
    /// address (if any) already loaded: `offset` bytes of the concatenation are taken.
    pub(super) fn l4_concatenation(&mut self, mut offset: usize) -> Result<(), Unsupported> {
        if offset > 0 {
            self.expect(".")?;
            if self.peek() == Some(self.address_family_word()) {
                self.position += 1;
                let source = match self.next()? {
                    "saddr" => true,
                    "daddr" => false,
                    other => return Err(format!("unsupported address key {other:?}")),
                };
                let (_, length) = self.address_field(source);
                self.load_address(source, register_at(offset), length);
                offset += length as usize;
                self.expect(".")?;
            }
            self.expect("meta")?;
            self.expect("l4proto")?;
        }
        self.emit(Expr::MetaLoad {
            key: META_L4PROTO,
            dreg: register_at(offset),
        });
        self.expect(".")?;
        self.expect("th")?;
        self.expect("dport")?;
        self.emit(Expr::Payload {
            dreg: register_at(offset + 4),
            base: BASE_TRANSPORT,
            offset: 2,
            len: 2,
        });
        let verdict = self.peek() == Some("vmap");
        if verdict {
            self.position += 1;
        }
        let set = self.reference()?;
        self.lookup_in(set, verdict.then_some(REG_VERDICT), false);
        Ok(())
    }

    /// `mark set mark or|xor V` and `mark and V ==|!= W`.
    pub(super) fn mark(&mut self) -> Result<(), Unsupported> {
        self.emit(Expr::MetaLoad {
            key: META_MARK,
            dreg: REG_1,
        });
        match self.next()? {
            "set" => {
                self.expect("mark")?;
                let operation = self.next()?;
                let value = parse_number(self.next()?)?;
                let (mask, xor) = match operation {
                    "or" => (!value, value),
                    "xor" => (u32::MAX, value),
                    other => return Err(format!("unsupported mark operation {other:?}")),
                };
                self.emit(Expr::Bitwise {
                    sreg: REG_1,
                    dreg: REG_1,
                    mask: mask.to_ne_bytes().to_vec(),
                    xor: xor.to_ne_bytes().to_vec(),
                    boolean_op: true,
                });
                self.emit(Expr::MetaSet {
                    key: META_MARK,
                    sreg: REG_1,
                });
            }
            "and" => {
                let value = parse_number(self.next()?)?;
                let op = match self.next()? {
                    "==" => CMP_EQ,
                    "!=" => CMP_NEQ,
                    other => return Err(format!("expected \"==\" or \"!=\", got {other:?}")),
                };
                let compared = parse_number(self.next()?)?;
                self.emit(Expr::Bitwise {
                    sreg: REG_1,
                    dreg: REG_1,
                    mask: value.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                    boolean_op: true,
                });
                self.emit(Expr::Cmp {
                    sreg: REG_1,
                    op,
                    data: compared.to_ne_bytes().to_vec(),
                });
            }
            other => return Err(format!("unsupported mark statement {other:?}")),
        }
        Ok(())
    }
}

/// The mask of a prefix of `bits` in the family of `address`.
fn prefix_mask(address: IpAddr, bits: u32) -> IpAddr {
    match address {
        IpAddr::V4(_) => IpAddr::V4((u32::MAX << (32 - bits)).into()),
        IpAddr::V6(_) => IpAddr::V6((u128::MAX << (128 - bits)).into()),
    }
}
