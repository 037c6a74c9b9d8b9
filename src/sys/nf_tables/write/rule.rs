//! One rule's statements (the words after `add rule FAMILY TABLE CHAIN`) compiled to
//! expressions the way nft compiles them: which bytes of which header are loaded into which
//! register, how a prefix is matched, when a set of addresses becomes an anonymous interval
//! set, and the verdict map of `numgen`.

use std::net::IpAddr;

use super::values::{self, AddressMatch, Unsupported, check_family, parse_verdict, unquote};
use crate::sys::nf_tables::expr::{Data, Expr, SetRef, Verdict, reg32};
use crate::sys::nf_tables::wire::{
    BASE_NETWORK, BASE_TRANSPORT, CMP_EQ, CMP_GT, CMP_NEQ, CT_DST_IP, CT_DST_IP6, CT_PACKETS,
    CT_STATE, CT_STATUS, META_IIFNAME, META_L4PROTO, META_MARK, NF_DROP, NFT_OBJECT_COUNTER,
    NFT_RETURN, REG_1, REG_2, REG_VERDICT,
};

/// The NAT range flag "random fully".
const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 0x10;
/// ICMP port unreachable, and its ICMPv6 equivalent.
const ICMP_PORT_UNREACH: u8 = 3;
const ICMPV6_PORT_UNREACH: u8 = 4;
/// Conntrack state bit "new".
const CT_STATE_NEW: u32 = 8;
/// Conntrack status bit "destination NAT done" (IPS_DST_NAT).
const CT_STATUS_DNAT: u32 = 0x20;
/// The length nft compares an interface name with (IFNAMSIZ).
const IFNAMSIZ: usize = 16;

/// An anonymous set or map a rule declares for itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnonymousSet {
    /// `numgen ... vmap { 0 : goto A , 1 : goto B }`: index -> verdict.
    VerdictMap {
        targets: Vec<Verdict>,
        sreg: u32,
        dreg: u32,
    },
    /// `dnat ip addr . port to numgen ... map { 0 : A . P , 1 : B . Q }`: index -> address and
    /// port.
    DestinationMap {
        targets: Vec<(IpAddr, u16)>,
        sreg: u32,
        dreg: u32,
    },
    /// `ip saddr [!=] { 10.0.0.0/8, 192.168.0.0/16 }`.
    Addresses {
        matches: Vec<AddressMatch>,
        source: bool,
        sreg: u32,
        inverted: bool,
    },
}

/// An expression, or an anonymous set whose lookup goes here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Expr(Expr),
    AnonymousSet(AnonymousSet),
}

/// A compiled rule.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompiledRule<'a> {
    pub exprs: Vec<Part>,
    pub comment: Option<&'a str>,
}

/// The 16-byte register for offsets that start one, else the 32-bit register (nft's choice
/// for the components of a concatenation).
fn register_at(offset: usize) -> u32 {
    if offset.is_multiple_of(16) {
        1 + (offset / 16) as u32
    } else {
        reg32(offset)
    }
}

/// Compiles `statements` for a table of the IPv6 family or not.
pub fn compile<'a>(statements: &[&'a str], ipv6: bool) -> Result<CompiledRule<'a>, Unsupported> {
    let mut rule = Builder {
        words: statements,
        position: 0,
        ipv6,
        out: CompiledRule::default(),
    };
    while rule.position < rule.words.len() {
        rule.statement()?;
    }
    Ok(rule.out)
}

struct Builder<'w, 'a> {
    words: &'w [&'a str],
    position: usize,
    ipv6: bool,
    out: CompiledRule<'a>,
}

impl<'a> Builder<'_, 'a> {
    fn peek(&self) -> Option<&'a str> {
        self.words.get(self.position).copied()
    }

    fn next(&mut self) -> Result<&'a str, Unsupported> {
        let word = self
            .peek()
            .ok_or_else(|| "the rule ends too early".to_string())?;
        self.position += 1;
        Ok(word)
    }

    fn expect(&mut self, wanted: &str) -> Result<(), Unsupported> {
        let word = self.next()?;
        if word == wanted {
            Ok(())
        } else {
            Err(format!("expected {wanted:?}, got {word:?}"))
        }
    }

    /// `@NAME`: the name of a set, map or flowtable.
    fn reference(&mut self) -> Result<&'a str, Unsupported> {
        let word = self.next()?;
        word.strip_prefix('@')
            .ok_or_else(|| format!("expected @name, got {word:?}"))
    }

    /// The next word as a number (`what` names it in the error).
    fn number<T: std::str::FromStr>(&mut self, what: &str) -> Result<T, Unsupported> {
        let word = self.next()?;
        word.parse().map_err(|_| format!("not {what}: {word:?}"))
    }

    /// Register 1 looked up in the named `set` (its data, for a map, into `dreg`).
    fn lookup_in(&mut self, set: &str, dreg: Option<u32>, inverted: bool) {
        self.emit(Expr::Lookup {
            sreg: REG_1,
            dreg,
            set: SetRef {
                name: set.to_string(),
                id: None,
            },
            inverted,
        });
    }

    fn emit(&mut self, expr: Expr) {
        self.out.exprs.push(Part::Expr(expr));
    }

    fn verdict(&mut self, verdict: Verdict) {
        self.emit(Expr::Immediate {
            dreg: REG_VERDICT,
            data: Data::Verdict(verdict),
        });
    }

    fn address_family_word(&self) -> &'static str {
        if self.ipv6 { "ip6" } else { "ip" }
    }

    /// The offset and length of the source or destination address in the IP header.
    fn address_field(&self, source: bool) -> (u32, u32) {
        match (self.ipv6, source) {
            (false, true) => (12, 4),
            (false, false) => (16, 4),
            (true, true) => (8, 16),
            (true, false) => (24, 16),
        }
    }

    fn load_address(&mut self, source: bool, dreg: u32, len: u32) {
        let (offset, _) = self.address_field(source);
        self.emit(Expr::Payload {
            dreg,
            base: BASE_NETWORK,
            offset,
            len,
        });
    }

    fn statement(&mut self) -> Result<(), Unsupported> {
        let word = self.next()?;
        match word {
            "ct" => self.conntrack()?,
            "ip" | "ip6" if word == self.address_family_word() => self.address_statement()?,
            "meta" => self.meta()?,
            "tcp" | "udp" | "sctp" => self.transport_port(word)?,
            "iifname" => self.iifname()?,
            "fib" => self.fib()?,
            "mark" => self.mark()?,
            "numgen" => self.numgen()?,
            "counter" if self.peek() == Some("name") => {
                self.expect("name")?;
                let name = unquote(self.next()?)?;
                self.emit(Expr::ObjRef {
                    kind: NFT_OBJECT_COUNTER,
                    name: name.to_string(),
                });
            }
            "counter" => self.emit(Expr::Counter),
            "flow" => {
                self.expect("add")?;
                let flowtable = self.reference()?;
                self.emit(Expr::FlowOffload {
                    flowtable: flowtable.to_string(),
                });
            }
            "update" => self.update()?,
            "dnat" => {
                if self.peek() == Some(self.address_family_word()) {
                    self.dnat_map()?;
                } else {
                    self.expect("to")?;
                    self.dnat()?;
                }
            }
            "masquerade" => {
                self.expect("fully-random")?;
                self.emit(Expr::Masq {
                    flags: NF_NAT_RANGE_PROTO_RANDOM_FULLY,
                });
            }
            "reject" => self.emit(Expr::Reject {
                code: if self.ipv6 {
                    ICMPV6_PORT_UNREACH
                } else {
                    ICMP_PORT_UNREACH
                },
            }),
            "drop" => self.verdict(Verdict {
                code: NF_DROP,
                chain: None,
            }),
            "return" => self.verdict(Verdict {
                code: NFT_RETURN,
                chain: None,
            }),
            "jump" | "goto" => {
                let chain = self.next()?;
                let verdict = parse_verdict(&[word, chain])?;
                self.verdict(verdict);
            }
            "comment" => {
                self.out.comment = Some(unquote(self.next()?)?);
                if self.peek().is_some() {
                    return Err("words after the comment".into());
                }
            }
            other => return Err(format!("unsupported statement {other:?}")),
        }
        Ok(())
    }

    /// `update @SET { ip saddr }`.
    fn update(&mut self) -> Result<(), Unsupported> {
        let set = self.reference()?;
        self.expect("{")?;
        self.expect(self.address_family_word())?;
        self.expect("saddr")?;
        self.expect("}")?;
        let (_, len) = self.address_field(true);
        self.load_address(true, REG_1, len);
        self.emit(Expr::DynsetUpdate {
            sreg: REG_1,
            set: SetRef {
                name: set.to_string(),
                id: None,
            },
        });
        Ok(())
    }

    /// `random mod N MAP { 0 : ENTRY , 1 : ENTRY }` after `numgen`, where MAP is `map` or `vmap`:
    /// the entries, as many as the modulus, in index order; the numgen expression is emitted.
    fn numgen_entries<T>(
        &mut self,
        map: &str,
        mut entry: impl FnMut(&mut Self) -> Result<T, Unsupported>,
    ) -> Result<Vec<T>, Unsupported> {
        self.expect("random")?;
        self.expect("mod")?;
        let modulus: u32 = self.number("a modulus")?;
        self.expect(map)?;
        self.expect("{")?;
        let mut entries = Vec::new();
        loop {
            let index: usize = self.number("an index")?;
            if index != entries.len() {
                return Err("map indexes out of order".into());
            }
            self.expect(":")?;
            entries.push(entry(self)?);
            match self.next()? {
                "," => continue,
                "}" => break,
                other => return Err(format!("unexpected {other:?} in a map")),
            }
        }
        if entries.len() as u32 != modulus {
            return Err("the modulus is not the number of targets".into());
        }
        self.emit(Expr::Numgen {
            dreg: REG_1,
            modulus,
            offset: 0,
        });
        Ok(entries)
    }

    /// `numgen random mod N vmap { 0 : goto A , 1 : goto B }`.
    fn numgen(&mut self) -> Result<(), Unsupported> {
        let targets = self.numgen_entries("vmap", |rule| {
            let verb = rule.next()?;
            let chain = rule.next()?;
            parse_verdict(&[verb, chain])
        })?;
        self.out
            .exprs
            .push(Part::AnonymousSet(AnonymousSet::VerdictMap {
                targets,
                sreg: REG_1,
                dreg: REG_VERDICT,
            }));
        Ok(())
    }

    /// `ip addr . port to numgen random mod N map { 0 : A . P , 1 : B . Q }` (after `dnat`):
    /// the address and port come from an anonymous map indexed by the random number; or
    /// `... numgen random mod N map @NAME`, from a named interval map.
    fn dnat_map(&mut self) -> Result<(), Unsupported> {
        self.position += 1;
        for word in ["addr", ".", "port", "to", "numgen"] {
            self.expect(word)?;
        }
        if let Some((modulus, offset, name)) = self.named_draw_map()? {
            self.emit(Expr::Numgen {
                dreg: REG_1,
                modulus,
                offset,
            });
            self.emit(Expr::HostToNetwork32 { reg: REG_1 });
            self.lookup_in(name, Some(REG_1), false);
            return self.dnat_from_registers();
        }
        let targets = self.numgen_entries("map", |rule| {
            let address: IpAddr = rule.number("an address")?;
            if address.is_ipv6() != rule.ipv6 {
                return Err("an address of the other family".into());
            }
            rule.expect(".")?;
            let port: u16 = rule.number("a port")?;
            Ok((address, port))
        })?;
        self.out
            .exprs
            .push(Part::AnonymousSet(AnonymousSet::DestinationMap {
                targets,
                sreg: REG_1,
                dreg: REG_1,
            }));
        self.dnat_from_registers()
    }

    /// `random mod N [offset O] map @NAME` after `numgen`, taken; `None` (nothing taken) for
    /// an anonymous map.
    fn named_draw_map(&mut self) -> Result<Option<(u32, u32, &'a str)>, Unsupported> {
        let start = self.position;
        self.expect("random")?;
        self.expect("mod")?;
        let modulus = parse_number(self.next()?)?;
        let mut offset = 0;
        if self.peek() == Some("offset") {
            self.position += 1;
            offset = parse_number(self.next()?)?;
        }
        self.expect("map")?;
        match self.next()?.strip_prefix('@') {
            Some(name) => Ok(Some((modulus, offset, name))),
            None => {
                self.position = start;
                Ok(None)
            }
        }
    }

    /// DNAT to the address and port a map lookup left in the registers.
    fn dnat_from_registers(&mut self) -> Result<(), Unsupported> {
        // The port follows the address in the map's data.
        let (_, length) = self.address_field(false);
        self.emit(Expr::DnatRange {
            family: if self.ipv6 { 10 } else { 2 },
            addr: REG_1,
            port: register_at(length as usize),
        });
        Ok(())
    }

    /// `ADDRESS:PORT` or `[ADDRESS]:PORT`.
    fn dnat(&mut self) -> Result<(), Unsupported> {
        let target = self.next()?;
        let (address, port) = target
            .rsplit_once(':')
            .ok_or_else(|| "dnat needs a port".to_string())?;
        let address = address.trim_start_matches('[').trim_end_matches(']');
        let address: IpAddr = address
            .parse()
            .map_err(|_| format!("not an address: {address:?}"))?;
        if address.is_ipv6() != self.ipv6 {
            return Err("an address of the other family".into());
        }
        let port: u16 = port.parse().map_err(|_| "not a port".to_string())?;
        self.emit(Expr::Immediate {
            dreg: REG_1,
            data: Data::Value(values::address_bytes(address)),
        });
        self.emit(Expr::Immediate {
            dreg: REG_2,
            data: Data::Value(port.to_be_bytes().to_vec()),
        });
        self.emit(Expr::Dnat {
            family: if self.ipv6 { 10 } else { 2 },
            addr: REG_1,
            port: REG_2,
        });
        Ok(())
    }
}

fn parse_number(text: &str) -> Result<u32, Unsupported> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => text.parse(),
    }
    .map_err(|_| format!("not a number: {text:?}"))
}

mod matches;
