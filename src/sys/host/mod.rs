//! The host around the rules: links and their addresses (rtnetlink), sysctls and the local
//! addresses, the processes of the tools the modes run, and which socket takes a connection.

pub mod link;
pub mod net;
pub mod process;
pub mod sockets;
