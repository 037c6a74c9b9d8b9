//! Set and map lookups as the kernel's set backends do them, and a random draw looked up:
//! the draw is cut where the set's elements begin and end, and each piece forks the packet's
//! state, weighted by its share of the draw.

use super::TraceError;
use super::evaluate::{RuleEnd, State, bytes, offset, one, store};
use super::ruleset::{Element, Set};
use crate::sys::nf_tables::expr::Data;
use crate::sys::nf_tables::wire::{REG_VERDICT, SET_INTERVAL};

/// A random draw's value: every number from `first` to `last`, in host or network order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Draw {
    pub(super) first: u32,
    pub(super) last: u32,
    pub(super) network_order: bool,
}

impl Draw {
    fn count(&self) -> f64 {
        f64::from(self.last - self.first) + 1.0
    }
}

/// The element of `set` a key matches, as the kernel's set backends find it: exact for a
/// hash, and for an interval set the greatest bound at or below it, when that bound starts an
/// interval. Concatenations of ranges (elements with a last key: the pipapo backend, which
/// compares field by field) are not modelled.
fn find<'a>(set: &'a Set, key: &[u8]) -> Result<Option<&'a Element>, TraceError> {
    if set.flags & SET_INTERVAL == 0 {
        return Ok(set.elements.iter().find(|e| e.key == key));
    }
    if set.elements.iter().any(|e| e.key_end.is_some()) {
        return Err(TraceError::Unsupported(
            "a set of concatenated ranges".into(),
        ));
    }
    Ok(set
        .elements
        .iter()
        .filter(|e| e.key.as_slice() <= key)
        // The greatest bound; at equal keys a start beats the end of the interval before.
        .max_by(|a, b| (&a.key, !a.interval_end).cmp(&(&b.key, !b.interval_end)))
        .filter(|e| !e.interval_end))
}

pub(super) fn lookup(
    set: &Set,
    sreg: u32,
    dreg: Option<u32>,
    inverted: bool,
    state: State,
) -> Result<Vec<(State, RuleEnd)>, TraceError> {
    let index = offset(sreg)? / 4;
    let Some(draw) = state.draws[index] else {
        let key = bytes(&state, sreg, set.key_len)?.to_vec();
        let found = find(set, &key)?;
        return found_or_not(found, dreg, inverted, state);
    };
    if set.key_len != 4 {
        return Err(TraceError::Unsupported(
            "a random draw in a concatenated key".into(),
        ));
    }
    if set.flags & SET_INTERVAL != 0 && !draw.network_order {
        return Err(TraceError::Unsupported(
            "an interval lookup of a host-order draw".into(),
        ));
    }
    let number = |key: &[u8]| -> Option<u32> {
        let four: [u8; 4] = key.try_into().ok()?;
        Some(if draw.network_order {
            u32::from_be_bytes(four)
        } else {
            u32::from_ne_bytes(four)
        })
    };
    // The draw's values are cut at each bound of an interval (after the last key of a range,
    // around an exact key), so that every piece finds the same element throughout.
    let interval = set.flags & SET_INTERVAL != 0;
    let mut cuts: Vec<u32> = set
        .elements
        .iter()
        .flat_map(|e| {
            let first = number(&e.key);
            let last = match &e.key_end {
                Some(end) => number(end),
                None if interval => None,
                None => first,
            };
            [first, last.and_then(|k| k.checked_add(1))]
        })
        .flatten()
        .filter(|cut| *cut > draw.first && *cut <= draw.last)
        .collect();
    cuts.push(draw.first);
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::new();
    for (i, first) in cuts.iter().enumerate() {
        let last = cuts.get(i + 1).map_or(draw.last, |next| next - 1);
        let piece = Draw {
            first: *first,
            last,
            network_order: draw.network_order,
        };
        let key = if draw.network_order {
            first.to_be_bytes()
        } else {
            first.to_ne_bytes()
        };
        let mut forked = state.clone();
        forked.weight *= piece.count() / draw.count();
        forked.draws[index] = Some(piece);
        let found = find(set, &key)?;
        out.extend(found_or_not(found, dreg, inverted, forked)?);
    }
    Ok(out)
}

fn found_or_not(
    found: Option<&Element>,
    dreg: Option<u32>,
    inverted: bool,
    mut state: State,
) -> Result<Vec<(State, RuleEnd)>, TraceError> {
    if found.is_some() == inverted {
        return one(state, RuleEnd::Break);
    }
    match (dreg, found.and_then(|e| e.data.as_ref())) {
        (None, _) => one(state, RuleEnd::Next),
        (Some(REG_VERDICT), Some(Data::Verdict(verdict))) => {
            one(state, RuleEnd::Verdict(verdict.clone()))
        }
        (Some(register), Some(Data::Value(value))) => {
            store(&mut state, register, value)?;
            one(state, RuleEnd::Next)
        }
        _ => Err(TraceError::Unsupported(
            "a map lookup whose element has no data of its kind".into(),
        )),
    }
}
