//! End-to-end tests of the `xfer` binary over loopback: whole trees byte-identical, live stream
//! count changes, resume after SIGKILL of either side, every bad input with its error, the
//! receiver started over ssh (an sshd in a network namespace), transfers striped over node
//! pairs started over ssh, the receiver as a daemon (configuration file, SIGTERM, metrics)
//! under load, one limit on a transfer's rate, the Debian package installed in a
//! container-like root, and the fault-injection suite.

mod bad_input;
mod chaos;
mod common;
mod daemon;
mod dry_run;
mod faults;
mod fetch;
mod filters;
mod load;
mod mirror;
mod mptcp;
mod netns;
mod nodes;
mod odd_sizes;
mod optimize;
mod package;
mod quic;
mod rate_limit;
mod resume;
mod sim;
mod ssh_start;
mod tree;
