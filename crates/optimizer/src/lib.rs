//! Decision logic of xfer: signals, utility and stream-count controllers. It performs no I/O and
//! reads no clock; observations arrive with their timestamps. (Filled in by the optimiser issue.)
