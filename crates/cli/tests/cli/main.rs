//! End-to-end tests of the `xfer` binary over loopback: whole trees byte-identical, live stream
//! count changes, resume after SIGKILL of either side, and every bad input with its error.

mod bad_input;
mod common;
mod odd_sizes;
mod optimize;
mod resume;
mod sim;
mod tree;
