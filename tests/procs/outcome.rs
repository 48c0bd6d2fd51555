//! What a real-process run of `http:v1` deliveries must end with, asked of the
//! ledger and of the reference receiver (`chaos.rs`, `db_failover.rs`): every
//! attempt SUCCEEDED, every key applied once, every receipt what the receiver stored
//! for its key. Each check answers its problems, one line each; none is a pass.
// Each test file uses its part of this.
#![allow(dead_code)]

use leasehold::engine::canonical::sha256_hex;
use leasehold::engine::{AttemptRecord, AttemptStatus, CommandStatus, PlanSpec, ReceiptStatus};
use leasehold::receiver::Effects;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Steps of each plan.
pub const STEPS: usize = 3;

/// The plan of attempt `n`: three http:v1 steps posting to the target.
pub fn plan(name: &str, n: usize, target: &str) -> PlanSpec {
    let steps: Vec<Value> = (1..=STEPS)
        .map(|s| {
            json!({
                "code": format!("step-{s}"),
                "executor": "http:v1",
                "payload": {
                    "url": format!("http://{target}/orders/{n}/{s}"),
                    "body": body(n, s),
                    "evidence": ["/id"],
                    "timeout_ms": 2_000,
                    "budget_ms": 5_000,
                },
            })
        })
        .collect();
    serde_json::from_value(json!({"name": format!("{name}-{n:03}"), "recovery": "resume", "steps": steps}))
        .expect("a valid plan")
}

/// What step `step` of attempt `n` posts.
pub fn body(n: usize, step: usize) -> Value {
    json!({"order": n, "step": step})
}

/// Every attempt SUCCEEDED, its command DELIVERED, every receipt SUCCEEDED.
pub fn ledger_problems(records: &[(usize, AttemptRecord)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (_, r) in records {
        if r.attempt.status != AttemptStatus::Succeeded || r.command.status != CommandStatus::Delivered {
            problems.push(format!(
                "attempt {} is {} (command {}): {:?} / {:?}",
                r.attempt.id, r.attempt.status, r.command.status, r.attempt.error, r.command.last_error
            ));
        }
        for receipt in &r.receipts {
            if receipt.status != ReceiptStatus::Succeeded {
                problems.push(format!(
                    "attempt {} step {} is {}: {:?}",
                    r.attempt.id, receipt.step_code, receipt.status, receipt.error
                ));
            }
        }
    }
    problems
}

/// The target applied each of the ledger's keys exactly once, and nothing else.
pub fn effect_problems<'a>(records: impl IntoIterator<Item = &'a AttemptRecord>, effects: &Effects) -> Vec<String> {
    let keys: BTreeSet<&str> = records
        .into_iter()
        .flat_map(|r| r.receipts.iter().map(|x| x.idempotency_key.as_str()))
        .collect();
    let applied: BTreeSet<&str> = effects.by_key.keys().map(String::as_str).collect();
    let mut problems = Vec::new();
    if keys != applied {
        problems.push(format!(
            "keys the ledger holds but the target never applied: {:?}; applied but unknown to the ledger: {:?}",
            keys.difference(&applied).collect::<Vec<_>>(),
            applied.difference(&keys).collect::<Vec<_>>()
        ));
    }
    for (key, n) in &effects.by_key {
        if *n != 1 {
            problems.push(format!("key {key} was applied {n} times"));
        }
    }
    if effects.effects != keys.len() as u64 || effects.keys != keys.len() as u64 || effects.in_progress != 0 {
        problems.push(format!(
            "the target holds {} keys done, {} in progress, {} effects for {} keys",
            effects.keys,
            effects.in_progress,
            effects.effects,
            keys.len()
        ));
    }
    problems
}

/// Every receipt is what the target stored for its key: asked again as a sender
/// would (same key, same body), the target replays, and applies nothing more.
pub fn receipt_problems(
    runtime: &tokio::runtime::Runtime,
    records: &[(usize, AttemptRecord)],
    addr: &str,
    before: &Effects,
) -> Vec<String> {
    let asks: Vec<(String, Value)> = records
        .iter()
        .flat_map(|(n, r)| {
            r.receipts
                .iter()
                .map(move |x| (x.idempotency_key.clone(), body(*n, x.ordinal as usize)))
        })
        .collect();
    let stored: BTreeMap<String, Result<Value, String>> = runtime.block_on(async {
        let client = reqwest::Client::new();
        let mut tasks = tokio::task::JoinSet::new();
        for (key, body) in asks {
            let (client, url) = (client.clone(), format!("http://{addr}/orders"));
            tasks.spawn(async move {
                let body = leasehold::engine::canonical::canonical_json(&body);
                // The target still fails some requests (503): ask again.
                for _ in 0..50 {
                    let Ok(response) = client
                        .post(&url)
                        .header("idempotency-key", &key)
                        .body(body.clone())
                        .send()
                        .await
                    else {
                        continue;
                    };
                    if response.status() == 503 {
                        continue;
                    }
                    let replayed = response
                        .headers()
                        .get("idempotent-replayed")
                        .is_some_and(|v| v == "true");
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    return (
                        key,
                        if status == 201 && replayed {
                            serde_json::from_str(&text).map_err(|e| e.to_string())
                        } else {
                            Err(format!("answered {status} (replayed: {replayed}): {text}"))
                        },
                    );
                }
                (key, Err("no answer but 503 in 50 tries".to_owned()))
            });
        }
        let mut stored = BTreeMap::new();
        while let Some(done) = tasks.join_next().await {
            let (key, value) = done.unwrap();
            stored.insert(key, value);
        }
        stored
    });
    let mut problems = Vec::new();
    for (_, r) in records {
        for receipt in &r.receipts {
            let key = &receipt.idempotency_key;
            let stored = match &stored[key] {
                Ok(v) => v,
                Err(e) => {
                    problems.push(format!("key {key}: the target did not replay it: {e}"));
                    continue;
                }
            };
            let parse = |text: &Option<String>| -> Value {
                text.as_deref()
                    .and_then(|t| serde_json::from_str(t).ok())
                    .unwrap_or(Value::Null)
            };
            let expected_receipt = json!({"idempotency_key": key, "id": stored["id"]});
            if parse(&receipt.target_receipt) != expected_receipt {
                problems.push(format!(
                    "key {key}: target receipt {:?} is not the target's stored response {stored}",
                    receipt.target_receipt
                ));
            }
            if parse(&receipt.evidence) != json!({"status": 201, "fields": {"/id": stored["id"]}}) {
                problems.push(format!(
                    "key {key}: evidence {:?} is not the target's stored response {stored}",
                    receipt.evidence
                ));
            }
            let digest = receipt.evidence.as_deref().map(|e| sha256_hex(e.as_bytes()));
            if digest.is_none() || digest != receipt.evidence_sha256 {
                problems.push(format!("key {key}: evidence does not match its SHA-256"));
            }
        }
    }
    let after = super::effects(runtime, addr);
    if after.by_key != before.by_key || after.effects != before.effects {
        problems.push("asking again applied something".to_owned());
    }
    problems
}
