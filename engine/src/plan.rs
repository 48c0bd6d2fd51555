//! Plan files, their validation and their fingerprint.
//!
//! Validation happens before any durable state is written: a [`PlanSpec`] becomes a
//! [`Plan`] only through [`PlanSpec::into_plan`], and every error names the field.

use crate::canonical::fingerprint;
use crate::ids::{AttemptId, PlanId, Timestamp};
use crate::input::{InputError, InputSchema};
use crate::model::OnFailure;
use crate::model::{Plan, PlanStatus, Recovery, Step};
use crate::names::Forbidden;
use crate::policy::{PolicyError, RetrySpec};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The largest canonical payload a step may carry.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// The longest plan name, step code or volatile field name, in characters.
pub const MAX_NAME_CHARS: usize = 200;
/// The most steps a plan may have.
pub const MAX_STEPS: usize = 1_000;
/// The most volatile fields a plan may name.
pub const MAX_VOLATILE_FIELDS: usize = 100;
/// The largest plan file the CLI reads, in bytes: room for [`MAX_STEPS`] small steps
/// or a few large payloads, and a bound on what a hostile file can make it allocate.
pub const MAX_PLAN_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// A plan as written in a plan file (TOML or JSON). Unknown fields are refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanSpec {
    /// Human name.
    pub name: String,
    /// `resume` or `replay`, kept as text so that a bad value names the field.
    pub recovery: String,
    /// Extra keys the semantic fingerprint strips.
    #[serde(default)]
    pub volatile_fields: Vec<String>,
    /// Ordered steps.
    #[serde(default)]
    pub steps: Vec<Step>,
    /// The delivery policy of every step that sets none of its own
    /// ([`crate::policy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetrySpec>,
    /// The queue its attempts go to ([`crate::route`]); none: the default queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Its `[input]` table: each attempt brings input of these fields, and step
    /// payloads refer to it ([`crate::input`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<InputSchema>,
    /// A template's rule for ordered keys when an attempt ends without succeeding:
    /// `block` (the default) or `continue` ([`crate::order`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<String>,
}

/// Why a plan is invalid. Each names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// `name` is empty.
    #[error("name: must not be empty")]
    EmptyName,
    /// `recovery` is neither `resume` nor `replay`.
    #[error("recovery: {0:?} is not a recovery mode (expected resume or replay)")]
    BadRecovery(String),
    /// No steps.
    #[error("steps: a plan needs at least one step")]
    NoSteps,
    /// A step code is empty.
    #[error("steps[{index}].code: must not be empty")]
    EmptyCode {
        /// 0-based index of the step.
        index: usize,
    },
    /// Two steps share a code.
    #[error("steps[{index}].code: {code:?} is used by an earlier step")]
    DuplicateCode {
        /// 0-based index of the later step.
        index: usize,
        /// The repeated code.
        code: String,
    },
    /// The executor is not one this installation knows.
    #[error("steps[{index}].executor: unknown executor {executor:?} (known: {known})")]
    UnknownExecutor {
        /// 0-based index of the step.
        index: usize,
        /// The executor named.
        executor: String,
        /// The known executors, comma-separated.
        known: String,
    },
    /// The payload is too large.
    #[error("steps[{index}].payload: {bytes} bytes exceeds the limit of {MAX_PAYLOAD_BYTES} bytes")]
    PayloadTooLarge {
        /// 0-based index of the step.
        index: usize,
        /// Its canonical size.
        bytes: usize,
    },
    /// A queue or target name is empty.
    #[error("{field}: must not be empty")]
    Empty {
        /// The field, e.g. `queue`.
        field: String,
    },
    /// A volatile field name is empty.
    #[error("volatile_fields[{index}]: must not be empty")]
    EmptyVolatileField {
        /// 0-based index.
        index: usize,
    },
    /// A name, code or volatile field holds a control character (a newline, an
    /// escape…), which could forge lines of output or logs.
    #[error("{field}: must not contain control characters (found {found})")]
    ControlCharacter {
        /// The field, e.g. `steps[2].code`.
        field: String,
        /// The first one, escaped (`\n`, `\u{1b}`).
        found: String,
    },
    /// A name, code or volatile field holds a format, separator or otherwise
    /// invisible character ([`crate::names`]), which would make it look like
    /// another name.
    #[error("{field}: must not contain invisible or separator characters (found {code_point})")]
    InvisibleCharacter {
        /// The field, e.g. `steps[2].code`.
        field: String,
        /// The first one, as `U+200B`.
        code_point: String,
    },
    /// A name, code or volatile field is too long.
    #[error("{field}: {chars} characters exceeds the limit of {MAX_NAME_CHARS}")]
    TooLong {
        /// The field.
        field: String,
        /// Its length in characters.
        chars: usize,
    },
    /// Too many steps or volatile fields.
    #[error("{field}: {count} entries exceeds the limit of {max}")]
    TooMany {
        /// `steps` or `volatile_fields`.
        field: &'static str,
        /// How many there are.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A step's target cannot be known: an `http:v1` step without a usable `url`, or
    /// with a `target` of its own.
    #[error("steps[{index}].{why}")]
    BadTarget {
        /// 0-based index of the step.
        index: usize,
        /// The field and why, e.g. `payload.url: is missing`.
        why: String,
    },
    /// A delivery policy value is zero, negative or inconsistent.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The `[input]` table, a `$input` reference or `on_failure` is invalid.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The stored fingerprint does not match the plan's content.
    #[error("fingerprint: stored {stored} but the content hashes to {computed}")]
    FingerprintMismatch {
        /// The fingerprint on record.
        stored: String,
        /// The fingerprint of the content.
        computed: String,
    },
}

impl PlanSpec {
    /// Validates the spec against the executors this installation knows and builds
    /// the plan, with its fingerprint. `id` and `now` come from the ledger.
    pub fn into_plan(self, known_executors: &[&str], id: PlanId, now: Timestamp) -> Result<Plan, PlanError> {
        if self.name.trim().is_empty() {
            return Err(PlanError::EmptyName);
        }
        check_text("name", &self.name)?;
        if self.steps.len() > MAX_STEPS {
            return Err(PlanError::TooMany {
                field: "steps",
                count: self.steps.len(),
                max: MAX_STEPS,
            });
        }
        if self.volatile_fields.len() > MAX_VOLATILE_FIELDS {
            return Err(PlanError::TooMany {
                field: "volatile_fields",
                count: self.volatile_fields.len(),
                max: MAX_VOLATILE_FIELDS,
            });
        }
        let recovery: Recovery = self
            .recovery
            .parse()
            .map_err(|_| PlanError::BadRecovery(self.recovery.clone()))?;
        if self.steps.is_empty() {
            return Err(PlanError::NoSteps);
        }
        for (index, field) in self.volatile_fields.iter().enumerate() {
            if field.is_empty() {
                return Err(PlanError::EmptyVolatileField { index });
            }
            check_text(&format!("volatile_fields[{index}]"), field)?;
        }
        for (index, step) in self.steps.iter().enumerate() {
            if step.code.trim().is_empty() {
                return Err(PlanError::EmptyCode { index });
            }
            check_text(&format!("steps[{index}].code"), &step.code)?;
            if self.steps[..index].iter().any(|s| s.code == step.code) {
                return Err(PlanError::DuplicateCode {
                    index,
                    code: step.code.clone(),
                });
            }
            if !known_executors.contains(&step.executor.as_str()) {
                return Err(PlanError::UnknownExecutor {
                    index,
                    executor: step.executor.clone(),
                    known: known_executors.join(", "),
                });
            }
            let bytes = crate::canonical::canonical_json(&step.payload).len();
            if bytes > MAX_PAYLOAD_BYTES {
                return Err(PlanError::PayloadTooLarge { index, bytes });
            }
            check_target(index, step)?;
        }
        if let Some(queue) = &self.queue {
            check_name("queue", queue)?;
        }
        let on_failure = checked_input(self.input.as_ref(), self.on_failure.as_deref(), &self.steps)?;
        let retry = checked_policy(self.retry.as_ref(), "retry")?;
        let mut steps = self.steps;
        for (index, step) in steps.iter_mut().enumerate() {
            step.retry = checked_policy(step.retry.as_ref(), &format!("steps[{index}].retry"))?;
        }
        let content = Content {
            name: &self.name,
            recovery,
            steps: &steps,
            volatile_fields: &self.volatile_fields,
            retry: retry.as_ref(),
            queue: self.queue.as_deref(),
            input: self.input.as_ref(),
            on_failure,
        };
        let fingerprint = plan_fingerprint(&content);
        Ok(Plan {
            id,
            name: self.name,
            status: PlanStatus::Ready,
            recovery,
            steps,
            volatile_fields: self.volatile_fields,
            retry,
            queue: self.queue,
            input: self.input,
            on_failure,
            fingerprint,
            created_at: now,
        })
    }
}

/// A template's `[input]` table and `on_failure`, and every `$input` reference in
/// the steps' payloads, checked; answers `on_failure` parsed. `on_failure` is a
/// template's only: a plan without input runs one attempt at a time.
fn checked_input(
    schema: Option<&InputSchema>,
    on_failure: Option<&str>,
    steps: &[Step],
) -> Result<Option<OnFailure>, PlanError> {
    if let Some(schema) = schema {
        crate::input::check_schema(schema)?;
    }
    crate::input::check_references(schema, steps.iter().map(|s| &s.payload).enumerate())?;
    let Some(text) = on_failure else {
        return Ok(None);
    };
    let field = |reason: String| InputError {
        field: "on_failure".to_owned(),
        reason,
    };
    let parsed: OnFailure = text
        .parse()
        .map_err(|_| field(format!("{text:?} is not a rule (expected block or continue)")))?;
    if schema.is_none() {
        return Err(field("only a plan with [input] has ordered keys to rule".to_owned()).into());
    }
    Ok(Some(parsed))
}

/// A step's target: set by hand only where the executor does not derive it
/// ([`crate::route::step_target`]), and a valid name.
fn check_target(index: usize, step: &Step) -> Result<(), PlanError> {
    if step.executor == crate::route::HTTP_EXECUTOR && step.target.is_some() {
        return Err(PlanError::BadTarget {
            index,
            why: "target: an http:v1 step's target is its url's scheme, host and port; it may not be set".to_owned(),
        });
    }
    if let Some(target) = &step.target {
        check_name(&format!("steps[{index}].target"), target)?;
    }
    crate::route::step_target(step)
        .map(|_| ())
        .map_err(|why| PlanError::BadTarget { index, why })
}

/// A name that must not be empty, checked as [`check_text`] does.
fn check_name(field: &str, text: &str) -> Result<(), PlanError> {
    if text.trim().is_empty() {
        return Err(PlanError::Empty {
            field: field.to_owned(),
        });
    }
    check_text(field, text)
}

/// A policy table checked and clamped ([`RetrySpec::checked`]); an empty one is
/// stored as none, so that it fingerprints like a plan without it.
fn checked_policy(spec: Option<&RetrySpec>, at: &str) -> Result<Option<RetrySpec>, PlanError> {
    match spec {
        Some(spec) if !spec.is_empty() => Ok(Some(spec.checked(at)?)),
        _ => Ok(None),
    }
}

/// Refuses a name, code or volatile field holding a character no name may hold
/// ([`crate::names`]) or longer than [`MAX_NAME_CHARS`].
fn check_text(field: &str, text: &str) -> Result<(), PlanError> {
    crate::names::check(field, text).map_err(|e| match e.forbidden {
        Forbidden::Control(c) => PlanError::ControlCharacter {
            field: e.field,
            found: c.escape_default().to_string(),
        },
        Forbidden::Invisible(c) => PlanError::InvisibleCharacter {
            field: e.field,
            code_point: crate::names::code_point(c),
        },
    })?;
    let chars = text.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(PlanError::TooLong {
            field: field.to_owned(),
            chars,
        });
    }
    Ok(())
}

/// What a plan's fingerprint covers: everything but its id, status and time.
#[derive(Clone, Copy, Debug)]
pub struct Content<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its recovery.
    pub recovery: Recovery,
    /// Its steps.
    pub steps: &'a [Step],
    /// Its volatile fields.
    pub volatile_fields: &'a [String],
    /// Its delivery policy, if it sets one.
    pub retry: Option<&'a RetrySpec>,
    /// Its queue, if it names one.
    pub queue: Option<&'a str>,
    /// Its `[input]` table, if it is a template.
    pub input: Option<&'a InputSchema>,
    /// Its `on_failure`, if it sets one.
    pub on_failure: Option<OnFailure>,
}

impl<'a> Content<'a> {
    /// The content of a stored plan.
    pub fn of(plan: &'a Plan) -> Self {
        Self {
            name: &plan.name,
            recovery: plan.recovery,
            steps: &plan.steps,
            volatile_fields: &plan.volatile_fields,
            retry: plan.retry.as_ref(),
            queue: plan.queue.as_deref(),
            input: plan.input.as_ref(),
            on_failure: plan.on_failure,
        }
    }
}

/// SHA-256 of the canonical JSON of a plan's content (everything but id and status).
/// A delivery policy, a step's target, a queue, an `[input]` table and `on_failure`
/// count where set; a plan without any hashes as it did before they existed.
pub fn plan_fingerprint(c: &Content<'_>) -> String {
    let step = |s: &Step| {
        let mut v = json!({"code": s.code, "executor": s.executor, "payload": s.payload});
        if let Some(r) = &s.retry {
            v["retry"] = json!(r);
        }
        if let Some(t) = &s.target {
            v["target"] = json!(t);
        }
        v
    };
    let mut content = json!({
        "name": c.name,
        "recovery": c.recovery.as_str(),
        "steps": c.steps.iter().map(step).collect::<Vec<Value>>(),
        "volatile_fields": c.volatile_fields,
    });
    if let Some(r) = c.retry {
        content["retry"] = json!(r);
    }
    if let Some(q) = c.queue {
        content["queue"] = json!(q);
    }
    if let Some(input) = c.input {
        content["input"] = json!(input);
    }
    if let Some(rule) = c.on_failure {
        content["on_failure"] = json!(rule);
    }
    fingerprint(&content)
}

/// Checks that a stored plan's fingerprint still matches its content.
pub fn verify_fingerprint(plan: &Plan) -> Result<(), PlanError> {
    let computed = plan_fingerprint(&Content::of(plan));
    if computed == plan.fingerprint {
        Ok(())
    } else {
        Err(PlanError::FingerprintMismatch {
            stored: plan.fingerprint.clone(),
            computed,
        })
    }
}

/// The idempotency key of a step of an attempt: a pure function of the attempt id,
/// the receipt's ordinal and the step code, so every delivery and takeover of the
/// same attempt sends the same key for the same step.
pub fn idempotency_key(attempt: &AttemptId, ordinal: u32, step_code: &str) -> String {
    let digest = crate::canonical::sha256_hex(format!("{attempt}\u{0}{ordinal}\u{0}{step_code}").as_bytes());
    format!("ik-{}", &digest[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[&str] = &["dry-run:v1"];

    fn spec(steps: Value) -> PlanSpec {
        serde_json::from_value(json!({"name": "p", "recovery": "resume", "steps": steps})).unwrap()
    }

    fn build(s: PlanSpec) -> Result<Plan, PlanError> {
        s.into_plan(KNOWN, PlanId::new("p1"), Timestamp::from_millis(0))
    }

    #[test]
    fn a_valid_plan_gets_a_stable_fingerprint() {
        let a = build(spec(
            json!([{"code": "a", "executor": "dry-run:v1", "payload": {"x": 1, "y": 2}}]),
        ))
        .unwrap();
        let b = build(spec(
            json!([{"code": "a", "executor": "dry-run:v1", "payload": {"y": 2, "x": 1.0}}]),
        ))
        .unwrap();
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_eq!(a.fingerprint.len(), 64);
        verify_fingerprint(&a).unwrap();
    }

    #[test]
    fn errors_name_the_field() {
        let e = build(spec(json!([]))).unwrap_err();
        assert_eq!(e.to_string(), "steps: a plan needs at least one step");
        let e = build(spec(json!([{"code": "a", "executor": "nope:v9"}]))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "steps[0].executor: unknown executor \"nope:v9\" (known: dry-run:v1)"
        );
        let e = build(spec(
            json!([{"code": "a", "executor": "dry-run:v1"}, {"code": "a", "executor": "dry-run:v1"}]),
        ))
        .unwrap_err();
        assert_eq!(e.to_string(), "steps[1].code: \"a\" is used by an earlier step");
        let big = "x".repeat(MAX_PAYLOAD_BYTES);
        let e = build(spec(
            json!([{"code": "a", "executor": "dry-run:v1", "payload": {"blob": big}}]),
        ))
        .unwrap_err();
        assert!(
            e.to_string().starts_with("steps[0].payload: 65547 bytes exceeds"),
            "{e}"
        );
        let mut s = spec(json!([{"code": "a", "executor": "dry-run:v1"}]));
        s.recovery = "rewind".into();
        assert_eq!(
            build(s).unwrap_err().to_string(),
            "recovery: \"rewind\" is not a recovery mode (expected resume or replay)"
        );
    }

    #[test]
    fn control_characters_and_oversized_names_are_refused_by_field() {
        let mut s = spec(json!([{"code": "a", "executor": "dry-run:v1"}]));
        s.name = "p\n[w1] attempt x: delivered".into();
        assert_eq!(
            build(s).unwrap_err().to_string(),
            "name: must not contain control characters (found \\n)"
        );
        let e = build(spec(json!([{"code": "a\u{1b}[31m", "executor": "dry-run:v1"}]))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "steps[0].code: must not contain control characters (found \\u{1b})"
        );
        let mut s = spec(json!([{"code": "a", "executor": "dry-run:v1"}]));
        s.volatile_fields = vec!["ok".into(), "x\u{202e}y".into()];
        assert!(build(s)
            .unwrap_err()
            .to_string()
            .starts_with("volatile_fields[1]: must not contain"));
        let long = "c".repeat(MAX_NAME_CHARS + 1);
        let e = build(spec(json!([{"code": long, "executor": "dry-run:v1"}]))).unwrap_err();
        assert_eq!(e.to_string(), "steps[0].code: 201 characters exceeds the limit of 200");
        let many: Vec<Value> = (0..=MAX_STEPS)
            .map(|i| json!({"code": format!("s{i}"), "executor": "dry-run:v1"}))
            .collect();
        let e = build(spec(Value::Array(many))).unwrap_err();
        assert_eq!(e.to_string(), "steps: 1001 entries exceeds the limit of 1000");
    }

    #[test]
    fn invisible_and_separator_characters_are_refused_by_field_and_code_point() {
        let mut s = spec(json!([{"code": "a", "executor": "dry-run:v1"}]));
        s.name = "dry\u{200b}-run".into();
        assert_eq!(
            build(s).unwrap_err().to_string(),
            "name: must not contain invisible or separator characters (found U+200B)"
        );
        let e = build(spec(
            json!([{"code": "a", "executor": "dry-run:v1"}, {"code": "b\u{2028}", "executor": "dry-run:v1"}]),
        ))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "steps[1].code: must not contain invisible or separator characters (found U+2028)"
        );
        let mut s = spec(json!([{"code": "a", "executor": "dry-run:v1"}]));
        s.volatile_fields = vec!["ok".into(), "\u{feff}at".into()];
        assert_eq!(
            build(s).unwrap_err().to_string(),
            "volatile_fields[1]: must not contain invisible or separator characters (found U+FEFF)"
        );
        let mut s =
            spec(json!([{"code": "étape 1", "executor": "dry-run:v1"}, {"code": "部署", "executor": "dry-run:v1"}]));
        s.name = "déploiement nocturne".into();
        s.volatile_fields = vec!["généré_à".into()];
        build(s).unwrap();
    }

    #[test]
    fn a_delivery_policy_is_checked_by_field_and_counts_in_the_fingerprint_only_when_set() {
        let steps = json!([{"code": "a", "executor": "dry-run:v1"}]);
        let plain = build(spec(steps.clone())).unwrap();
        let mut empty = spec(steps.clone());
        empty.retry = Some(RetrySpec::default());
        let empty = build(empty).unwrap();
        assert_eq!((empty.retry.as_ref(), &empty.fingerprint), (None, &plain.fingerprint));
        let with: PlanSpec = serde_json::from_value(json!({
            "name": "p", "recovery": "resume", "retry": {"max_deliveries": 999_999},
            "steps": [{"code": "a", "executor": "dry-run:v1", "retry": {"step_max_tries": 2}}],
        }))
        .unwrap();
        let with = build(with).unwrap();
        assert_ne!(with.fingerprint, plain.fingerprint);
        verify_fingerprint(&with).unwrap();
        assert_eq!(
            with.retry.as_ref().unwrap().max_deliveries,
            Some(10_000),
            "clamped and stored so"
        );
        assert_eq!(with.policy("a").step_max_tries, 2);
        let bad: PlanSpec = serde_json::from_value(json!({
            "name": "p", "recovery": "resume",
            "steps": [{"code": "a", "executor": "dry-run:v1"}, {"code": "b", "executor": "dry-run:v1", "retry": {"deadline_secs": 0}}],
        }))
        .unwrap();
        assert_eq!(
            build(bad).unwrap_err().to_string(),
            "steps[1].retry.deadline_secs: must be at least 1 (got 0)"
        );
        let mut tampered = with.clone();
        tampered.retry = None;
        assert!(
            verify_fingerprint(&tampered).is_err(),
            "the policy is part of the content"
        );
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let e =
            serde_json::from_value::<PlanSpec>(json!({"name": "p", "recovery": "resume", "stepz": []})).unwrap_err();
        assert!(e.to_string().contains("unknown field `stepz`"), "{e}");
    }

    #[test]
    fn tampered_plan_fails_verification() {
        let mut p = build(spec(json!([{"code": "a", "executor": "dry-run:v1"}]))).unwrap();
        p.steps[0].payload = json!({"evil": true});
        assert!(matches!(
            verify_fingerprint(&p),
            Err(PlanError::FingerprintMismatch { .. })
        ));
    }

    #[test]
    fn idempotency_keys_are_stable_per_attempt_and_step() {
        let a = AttemptId::new("att-1");
        assert_eq!(idempotency_key(&a, 1, "x"), idempotency_key(&a, 1, "x"));
        assert_ne!(idempotency_key(&a, 1, "x"), idempotency_key(&a, 2, "x"));
        assert_ne!(
            idempotency_key(&a, 1, "x"),
            idempotency_key(&AttemptId::new("att-2"), 1, "x")
        );
    }
}
