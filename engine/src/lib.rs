//! The sans-IO core of leasehold.
//!
//! Plain data in, plain data out: the model ([`model`]), plan validation and
//! fingerprints ([`plan`], [`canonical`]), routing ([`route`]), what a name may hold ([`names`]), every
//! transition of the design's table as a guard plus writes ([`transition`]), the
//! request vocabulary that names them all as data with its one entry point
//! ([`request::decide`]), lease math and the configuration clamp ([`lease`]), trace
//! context ([`trace`]), and the worker driver ([`driver`]). Time, ids and lease tokens are arguments; nothing here
//! reads a clock, draws a random number or does I/O.

pub mod canonical;
pub mod driver;
pub mod evidence;
pub mod gate;
pub mod ids;
pub mod input;
pub mod lease;
pub mod limits;
pub mod model;
pub mod names;
pub mod order;
pub mod plan;
pub mod policy;
pub mod request;
pub mod route;
pub mod trace;
pub mod transition;

pub use ids::{AttemptId, CommandId, LeaseToken, PlanId, Timestamp};
pub use model::{
    Action, Attempt, AttemptRecord, AttemptStatus, Command, CommandStatus, Lease, OnFailure, Plan, PlanStatus, Receipt,
    ReceiptStatus, Recovery, Step,
};
pub use plan::{PlanError, PlanSpec};
pub use policy::{Exhaustion, RetryPolicy, RetrySpec};
pub use request::{
    decide, ClaimRequest, Decision, Failure, Op, OperatorRequest, Reply, Request, WorkerOp, WorkerRequest,
};
pub use route::{Capabilities, Reach, Route};
pub use trace::TraceContext;
pub use transition::{Guard, Refusal, Writes};
