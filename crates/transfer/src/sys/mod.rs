//! Every unsafe block of the crate, each behind a safe function: socket options that neither
//! std, socket2 nor rustix offers ([`sockopt`]), the kernel's TCP and MPTCP statistics
//! structs ([`socket_info`]), windows of files mapped into memory that survive another
//! process truncating the file ([`mapped`]), and starting a file range's write-back
//! ([`writeback`]). Everything else reaches the kernel through std,
//! socket2 or rustix; the crate denies unsafe code outside this module (`lib.rs`).

#![allow(unsafe_code)]

pub(crate) mod mapped;
pub(crate) mod socket_info;
pub(crate) mod sockopt;
pub(crate) mod writeback;
