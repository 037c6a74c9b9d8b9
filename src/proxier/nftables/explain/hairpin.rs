//! Hairpin: a connection the draw sends back to the endpoint it came from is masqueraded in
//! postrouting when `@hairpin-connections` holds that endpoint's element.

use super::Reader;
use crate::model::address::octets;
use crate::proxier::explanation::{ExplainError, Outcome};
use crate::proxier::nftables::render::HAIRPIN_CONNECTIONS;
use crate::sys::nf_tables::write::KeyType;

impl Reader<'_> {
    /// With `--from` one of the candidates: whether its hairpin connections are masqueraded
    /// (one element of `@hairpin-connections`, looked up by key).
    pub(super) fn hairpin(&mut self, outcome: &Outcome) -> Result<(), ExplainError> {
        let (Some(source), Outcome::Dnat { candidates }) = (self.flow.source, outcome) else {
            return Ok(());
        };
        let Some(own) = candidates.iter().find(|c| c.endpoint.ip() == source) else {
            return Ok(());
        };
        let port = own.endpoint.port().to_be_bytes();
        let mut key = octets(source);
        key.extend(octets(source));
        key.extend([self.flow.protocol.number(), 0, 0, 0, port[0], port[1], 0, 0]);
        let address = self.address_type();
        let layout = [address, address, KeyType::Protocol, KeyType::Port];
        if self.element(HAIRPIN_CONNECTIONS, &layout, &key)?.is_some() {
            self.step(format!(
                "@{HAIRPIN_CONNECTIONS}: {source} . {source} . {} . {}: masqueraded when the draw sends {source} back to itself (hairpin)",
                self.flow.protocol.lower(),
                own.endpoint.port()
            ));
        }
        Ok(())
    }
}
