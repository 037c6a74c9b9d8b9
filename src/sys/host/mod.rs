//! The host around the rules: links and their addresses (rtnetlink), sysctls and the local
//! addresses, and the processes of the tools the modes run.

pub mod link;
pub mod net;
pub mod process;
