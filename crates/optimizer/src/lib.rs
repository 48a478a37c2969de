//! Decision logic of xfer: monitoring-interval signals, the utility, and stream-count
//! controllers. It performs no I/O and reads no clock; observations arrive with their
//! timestamps. Empty until the optimiser issue lands; the data plane already exposes what it
//! will consume (`transfer::sender::Transfer::sample_streams` and `set_target_streams`).
