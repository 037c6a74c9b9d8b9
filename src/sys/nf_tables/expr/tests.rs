use super::*;
use crate::sys::nf_tables::wire::{
    Attributes, BASE_NETWORK, CMP_EQ, CMP_NEQ, CT_STATE, META_L4PROTO, META_MARK, NFT_GOTO,
    NFTA_RULE_EXPRESSIONS, REG_1, REG_2, REG_VERDICT,
};

/// A rule's attributes holding `expressions`, as we send them.
fn rule(expressions: &[Expr]) -> Vec<u8> {
    let mut out = Attributes::new();
    out.nested(NFTA_RULE_EXPRESSIONS, |list| {
        for expression in expressions {
            list.nested(1, |element| expression.encode(element));
        }
    });
    out.into_bytes()
}

fn set(name: &str) -> SetRef {
    SetRef {
        name: name.into(),
        id: None,
    }
}

#[test]
fn every_expression_of_ours_reads_back_as_written() {
    let written = vec![
        Expr::MetaLoad {
            key: META_L4PROTO,
            dreg: REG_1,
        },
        Expr::Cmp {
            sreg: REG_1,
            op: CMP_EQ,
            data: vec![6],
        },
        Expr::Payload {
            dreg: REG_1,
            base: BASE_NETWORK,
            offset: 16,
            len: 4,
        },
        Expr::Bitwise {
            sreg: REG_1,
            dreg: REG_1,
            mask: vec![255, 255, 0, 0],
            xor: vec![0; 4],
            boolean_op: true,
        },
        Expr::Range {
            sreg: REG_1,
            op: 0,
            from: vec![0, 80],
            to: vec![0, 90],
        },
        Expr::MetaSet {
            key: META_MARK,
            sreg: REG_1,
        },
        Expr::Ct {
            key: CT_STATE,
            dreg: REG_1,
        },
        Expr::Immediate {
            dreg: REG_1,
            data: Data::Value(vec![10, 0, 0, 1]),
        },
        Expr::Lookup {
            sreg: REG_1,
            dreg: Some(REG_VERDICT),
            set: set("service-ips"),
            inverted: false,
        },
        Expr::Lookup {
            sreg: REG_1,
            dreg: None,
            set: set("cluster-ips"),
            inverted: true,
        },
        Expr::Numgen {
            dreg: REG_1,
            modulus: 16_384,
            offset: 2_140_094_464,
        },
        Expr::HostToNetwork32 { reg: REG_1 },
        Expr::DnatRange {
            family: 2,
            addr: REG_1,
            port: REG_2,
        },
        Expr::Masq { flags: 0x10 },
        Expr::Reject { code: 3 },
        Expr::FibAddressType {
            dreg: REG_1,
            source: true,
        },
        Expr::DynsetUpdate {
            sreg: REG_1,
            set: set("affinity-x"),
        },
        Expr::Immediate {
            dreg: REG_VERDICT,
            data: Data::Verdict(Verdict {
                code: NFT_GOTO,
                chain: Some("service-abc".into()),
            }),
        },
    ];
    let read = decode_rule(&rule(&written));
    assert_eq!(read, written);
}

#[test]
fn what_the_kernel_cannot_tell_apart_reads_back_in_one_form() {
    // A DNAT to immediate registers reads back as one to a map's: the kernel keeps the same
    // range flags for both. Counters are left out; an unknown expression stays as dumped.
    let written = [
        Expr::Dnat {
            family: 2,
            addr: REG_1,
            port: REG_2,
        },
        Expr::Counter,
        Expr::Cmp {
            sreg: REG_1,
            op: CMP_NEQ,
            data: vec![0; 4],
        },
    ];
    let read = decode_rule(&rule(&written));
    assert_eq!(
        read,
        [
            Expr::DnatRange {
                family: 2,
                addr: REG_1,
                port: REG_2,
            },
            written[2].clone(),
        ]
    );
    let unknown = Expr::Other {
        name: b"quota".to_vec(),
        data: Vec::new(),
    };
    assert_eq!(
        decode_rule(&rule(std::slice::from_ref(&unknown))),
        [unknown]
    );
}
