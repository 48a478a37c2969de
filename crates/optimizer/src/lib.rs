//! Decision logic of xfer: monitoring-interval signals, the utility and reward, stream-count
//! controllers, and a simulator to run them on. It performs no I/O and reads no clock:
//! observations arrive with their timestamps, decisions leave as stream counts.
//!
//! The loop, for a real transfer or the simulator alike: at the end of each monitoring interval
//! (MI) the caller sums its streams' counters into an [`MiStats`], a [`SignalTracker`] turns it
//! into an [`Observation`] (throughput, loss, RTT ratio and gradient, utility, reward), and a
//! [`Controller`] answers with the stream count for the next interval.
//!
//! The controllers: [`Fixed`], [`CountSchedule`], [`GradientDescent`], `BayesianOptimizer`
//! (feature `bo`), the learned [`policy::PolicyController`] (a PPO policy exported by
//! `training/`, run by tract with the `onnx` feature or libtorch with `tch`), and [`Auto`],
//! which guards and fine-tunes a policy. The [`mod@env`] module serves the environment
//! protocol that trains such a policy on the [`sim`]ulator.
//!
//! Features: `onnx` and `bo` (both default) bring tract and egobox, more than half of the
//! crate's dependencies; without them the crate has everything else.

#![warn(missing_docs)]

mod auto;
#[cfg(feature = "bo")]
mod bo;
mod controller;
pub mod env;
mod gd;
pub mod policy;
mod running_mean;
mod schedule;
mod settle;
mod signals;
pub mod sim;
mod timetable;
mod trough;
mod utility;

pub use auto::{Auto, AutoParams};
#[cfg(feature = "bo")]
pub use bo::{BayesianOptimizer, BoParams};
pub use controller::{Acting, Controller, ControllerSpec, Fixed, SpecError};
pub use gd::{GdParams, GradientDescent};
pub use schedule::CountSchedule;
pub use settle::{IntervalRamp, RampClock, Settling, RAMP_RTTS, RETIRING_SHARE};
pub use signals::{MiStats, Observation, SignalTracker};
pub use timetable::{format_time, parse_time, Timetable, TimetableError};
pub use utility::{RewardParams, UtilityParams};
