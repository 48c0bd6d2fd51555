//! Routing: what a step needs of the worker that runs it, and what a worker can run.
//!
//! Every step has a **route**: the plan's queue, the step's executor and the step's
//! **target** (what it calls). An `http:v1` step's target is `scheme://host:port`
//! from its payload's `url` (the scheme's default port filled in); any other step's
//! is its `target` field, or its executor's name. A command carries the route of the
//! step a claim would run next ([`Route::of_next`]), so that a ledger can filter its
//! claims by it, and the engine checks it again when it decides a claim
//! ([`Capabilities::refusal`]).
//!
//! A worker advertises its [`Capabilities`]: the executors it runs (each for any
//! target, or only for the targets it may reach, as `http:v1` for the hosts on its
//! egress allowlist) and the queues it takes.

use crate::model::{AttemptRecord, Command, Plan, Step};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The queue of a plan that names none, and the one a worker takes unless told.
pub const DEFAULT_QUEUE: &str = "default";

/// The executor whose target comes from its payload's `url`.
pub const HTTP_EXECUTOR: &str = "http:v1";

/// Where a step runs: queue, executor and target.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Route {
    /// The plan's queue ([`DEFAULT_QUEUE`] when it names none).
    pub queue: String,
    /// The step's executor.
    pub executor: String,
    /// The step's target.
    pub target: String,
}

impl Route {
    /// The route of the step with `code` in `plan` (an unknown code: an empty route,
    /// which no capability matches).
    pub fn of_step(plan: &Plan, code: &str) -> Route {
        let queue = plan.queue().to_owned();
        match plan.step(code) {
            Some(step) => Route {
                queue,
                executor: step.executor.clone(),
                target: step_target(step).unwrap_or_default(),
            },
            None => Route {
                queue,
                ..Route::default()
            },
        }
    }

    /// The route of the step that `record` runs next (its first receipt that has not
    /// SUCCEEDED), as its receipts recorded it; `None` once every step SUCCEEDED.
    pub fn of_next(record: &AttemptRecord) -> Option<(String, String)> {
        let next = crate::transition::next_step(record)?;
        record.receipt(next).map(|r| (r.executor.clone(), r.target.clone()))
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {} (queue {})", self.executor, self.target, self.queue)
    }
}

/// The target of a step: `scheme://host:port` of an `http:v1` step's `url`, else
/// its `target` field or its executor's name. The error names the payload field
/// (an `http:v1` step without a usable `url`).
pub fn step_target(step: &Step) -> Result<String, String> {
    if step.executor == HTTP_EXECUTOR {
        return http_target(&step.payload);
    }
    Ok(step.target.clone().unwrap_or_else(|| step.executor.clone()))
}

/// `scheme://host:port` of `payload.url`.
fn http_target(payload: &Value) -> Result<String, String> {
    let text = match payload.get("url") {
        Some(Value::String(s)) => s,
        Some(_) => return Err("payload.url: must be a string".to_owned()),
        None => return Err("payload.url: is missing".to_owned()),
    };
    let url = url::Url::parse(text).map_err(|e| format!("payload.url: is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("payload.url: must be http or https, not {}", url.scheme()));
    }
    let host = url.host_str().ok_or("payload.url: has no host")?;
    let port = url.port_or_known_default().ok_or("payload.url: has no port")?;
    Ok(format!("{}://{}:{port}", url.scheme(), host.to_ascii_lowercase()))
}

/// Which targets a worker reaches through one executor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reach {
    /// Every target.
    Any,
    /// Only these (for `http:v1`: `scheme://host:port` of each allowed host).
    Only(BTreeSet<String>),
}

/// What a worker can run: its executors, each with its reach, and its queues.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Capabilities {
    /// The executors it runs, by name.
    pub executors: BTreeMap<String, Reach>,
    /// The queues it takes (a worker told none takes [`DEFAULT_QUEUE`]).
    pub queues: BTreeSet<String>,
}

impl Capabilities {
    /// Whether it can run nothing at all: no executor that reaches a target, or no
    /// queue.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
            || self
                .executors
                .values()
                .all(|r| matches!(r, Reach::Only(targets) if targets.is_empty()))
    }

    /// Whether a claim by this worker may consider `command`: the filter a ledger
    /// applies to the command row's queue, executor and target before the engine
    /// decides from the plan ([`Capabilities::refusal`]). A row written before
    /// routing (empty there) passes.
    pub fn admits(&self, command: &Command) -> bool {
        let queue = command.queue.is_empty() || self.queues.contains(&command.queue);
        let route = command.executor.is_empty()
            || match self.executors.get(&command.executor) {
                Some(Reach::Any) => true,
                Some(Reach::Only(targets)) => targets.contains(&command.target),
                None => false,
            };
        queue && route
    }

    /// Why this worker cannot run a step on `route`, or `None` when it can.
    pub fn refusal(&self, route: &Route) -> Option<String> {
        if !self.queues.contains(&route.queue) {
            return Some(format!("it takes no work of queue {}", route.queue));
        }
        match self.executors.get(&route.executor) {
            None => Some(format!("it has no executor {}", route.executor)),
            Some(Reach::Any) => None,
            Some(Reach::Only(targets)) if targets.contains(&route.target) => None,
            Some(Reach::Only(_)) => Some(format!("its {} may not reach {}", route.executor, route.target)),
        }
    }
}

/// What an attempt waits for when no live worker can run its next step on `route`:
/// "a worker that can run acme-crm:v1", "… that may reach http://h:80 with http:v1",
/// "… that takes queue q".
pub fn waits_for(route: &Route, fleet: &[&Capabilities]) -> Option<String> {
    if fleet.iter().any(|c| c.refusal(route).is_none()) {
        return None;
    }
    if fleet.is_empty() {
        return Some("a worker (none is live)".to_owned());
    }
    let in_queue: Vec<&&Capabilities> = fleet.iter().filter(|c| c.queues.contains(&route.queue)).collect();
    let why = if in_queue.is_empty() {
        format!("a worker that takes queue {}", route.queue)
    } else if in_queue.iter().any(|c| c.executors.contains_key(&route.executor)) {
        format!("a worker that may reach {} with {}", route.target, route.executor)
    } else {
        format!("a worker that can run {}", route.executor)
    };
    Some(why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn step(executor: &str, payload: Value, target: Option<&str>) -> Step {
        Step {
            code: "s".into(),
            executor: executor.into(),
            payload,
            retry: None,
            target: target.map(str::to_owned),
        }
    }

    #[test]
    fn an_http_step_targets_scheme_host_and_port_with_the_default_port_filled_in() {
        let t = |url: &str| step_target(&step(HTTP_EXECUTOR, json!({ "url": url }), None));
        assert_eq!(t("http://CRM.example/v1/x?y=1").unwrap(), "http://crm.example:80");
        assert_eq!(t("https://crm.example/").unwrap(), "https://crm.example:443");
        assert_eq!(t("http://127.0.0.1:18141/a").unwrap(), "http://127.0.0.1:18141");
        assert_eq!(t("http://[::1]:9/").unwrap(), "http://[::1]:9");
        assert!(t("ftp://x/")
            .unwrap_err()
            .contains("payload.url: must be http or https"));
        assert!(step_target(&step(HTTP_EXECUTOR, json!({}), None))
            .unwrap_err()
            .contains("payload.url: is missing"));
    }

    #[test]
    fn other_steps_target_their_target_field_or_their_executor() {
        assert_eq!(
            step_target(&step("acme-crm:v1", json!({}), None)).unwrap(),
            "acme-crm:v1"
        );
        assert_eq!(
            step_target(&step("acme-crm:v1", json!({}), Some("crm-eu"))).unwrap(),
            "crm-eu"
        );
    }

    fn route(queue: &str, executor: &str, target: &str) -> Route {
        Route {
            queue: queue.into(),
            executor: executor.into(),
            target: target.into(),
        }
    }

    fn worker(http: &[&str], others: &[&str], queues: &[&str]) -> Capabilities {
        let mut executors: BTreeMap<String, Reach> = others.iter().map(|e| ((*e).to_owned(), Reach::Any)).collect();
        executors.insert(
            HTTP_EXECUTOR.into(),
            Reach::Only(http.iter().map(|t| (*t).to_owned()).collect()),
        );
        Capabilities {
            executors,
            queues: queues.iter().map(|q| (*q).to_owned()).collect(),
        }
    }

    #[test]
    fn a_worker_runs_a_route_only_with_the_executor_the_target_and_the_queue() {
        let w = worker(&["http://h:80"], &["dry-run:v1"], &[DEFAULT_QUEUE]);
        assert_eq!(w.refusal(&route("default", "http:v1", "http://h:80")), None);
        assert_eq!(w.refusal(&route("default", "dry-run:v1", "dry-run:v1")), None);
        assert_eq!(
            w.refusal(&route("default", "http:v1", "http://other:80")).unwrap(),
            "its http:v1 may not reach http://other:80"
        );
        assert_eq!(
            w.refusal(&route("default", "acme-crm:v1", "acme-crm:v1")).unwrap(),
            "it has no executor acme-crm:v1"
        );
        assert_eq!(
            w.refusal(&route("billing", "dry-run:v1", "dry-run:v1")).unwrap(),
            "it takes no work of queue billing"
        );
    }

    #[test]
    fn a_worker_without_a_reachable_executor_or_a_queue_can_run_nothing() {
        assert!(worker(&[], &[], &[DEFAULT_QUEUE]).is_empty());
        assert!(worker(&["http://h:80"], &[], &[]).is_empty());
        assert!(!worker(&["http://h:80"], &[], &[DEFAULT_QUEUE]).is_empty());
    }

    #[test]
    fn what_an_attempt_waits_for_names_the_missing_capability() {
        let cli = worker(&[], &["dry-run:v1"], &[DEFAULT_QUEUE]);
        let fleet = [&cli];
        let crm = route("default", "acme-crm:v1", "acme-crm:v1");
        assert_eq!(waits_for(&crm, &fleet).unwrap(), "a worker that can run acme-crm:v1");
        let http = route("default", "http:v1", "http://h:80");
        assert_eq!(
            waits_for(&http, &fleet).unwrap(),
            "a worker that may reach http://h:80 with http:v1"
        );
        let billing = route("billing", "dry-run:v1", "dry-run:v1");
        assert_eq!(
            waits_for(&billing, &fleet).unwrap(),
            "a worker that takes queue billing"
        );
        assert_eq!(waits_for(&route("default", "dry-run:v1", "dry-run:v1"), &fleet), None);
        assert_eq!(waits_for(&crm, &[]).unwrap(), "a worker (none is live)");
    }
}
