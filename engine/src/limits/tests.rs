use super::*;

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn cmd(n: u32) -> CommandId {
    CommandId::new(format!("cmd_{n:04}"))
}

fn limit(max: Option<u32>, rate: Option<Rate>, breaker: Option<Breaker>) -> TargetLimit {
    TargetLimit {
        target: "http://crm:80".into(),
        max_in_flight: max,
        rate,
        breaker,
    }
}

#[test]
fn rates_parse_with_their_unit_and_refuse_zero_naming_the_reason() {
    assert_eq!(
        Rate::parse("50/s").unwrap(),
        Rate {
            count: 50,
            per_ms: 1_000
        }
    );
    assert_eq!(Rate::parse("600/m").unwrap().per_ms, 60_000);
    assert_eq!(Rate::parse("3/hour").unwrap().per_ms, 3_600_000);
    assert_eq!(Rate::parse("50/s").unwrap().to_string(), "50/s");
    assert!(Rate::parse("0/s").unwrap_err().contains("at least 1"));
    assert!(Rate::parse("-2/s").unwrap_err().contains("at least 1"));
    assert!(Rate::parse("5/d").unwrap_err().contains("unknown unit"));
    assert!(Rate::parse("5").unwrap_err().contains("not a rate"));
    assert!(Rate::parse("x/s").unwrap_err().contains("not a whole number"));
}

#[test]
fn a_limit_names_the_field_it_refuses() {
    assert!(limit(Some(0), None, None)
        .validate()
        .unwrap_err()
        .starts_with("max_in_flight: must be at least 1"));
    assert!(limit(None, None, None).validate().unwrap_err().contains("needs"));
    let b = Breaker {
        failures: 0,
        cooldown_ms: 1,
    };
    assert!(limit(None, None, Some(b))
        .validate()
        .unwrap_err()
        .starts_with("breaker_failures:"));
    let mut l = limit(Some(2), None, None);
    l.target = " x".into();
    assert!(l.validate().unwrap_err().starts_with("target:"));
    assert!(limit(Some(2), None, None).validate().is_ok());
}

#[test]
fn in_flight_admits_up_to_the_limit() {
    let l = limit(Some(2), None, None);
    let mut load = Load::default();
    assert!(l.admit(&mut load, &cmd(1), at(0)).is_ok());
    assert!(l.admit(&mut load, &cmd(2), at(0)).is_ok());
    assert_eq!(
        l.admit(&mut load, &cmd(3), at(0)).unwrap_err(),
        Blocked::InFlight {
            target: l.target.clone(),
            max: 2
        }
    );
    assert_eq!(load.in_flight, 2);
}

#[test]
fn a_rate_holds_over_every_window_not_only_aligned_ones() {
    let l = limit(
        None,
        Some(Rate {
            count: 3,
            per_ms: 1_000,
        }),
        None,
    );
    let mut load = Load::default();
    let mut admitted = Vec::new();
    for ms in (0..5_000).step_by(70) {
        if l.admit(&mut load, &cmd(ms as u32), at(ms)).is_ok() {
            admitted.push(ms);
        }
    }
    for (i, start) in admitted.iter().enumerate() {
        let within = admitted[i..].iter().filter(|t| **t < start + 1_000).count();
        assert!(within <= 3, "{within} entries in the window from {start}: {admitted:?}");
    }
    assert!(admitted.len() >= 15, "{admitted:?}");
    let err = l.admit(&mut load, &cmd(9), at(*admitted.last().unwrap())).unwrap_err();
    assert!(matches!(err, Blocked::Rate { .. }), "{err:?}");
}

#[test]
fn the_breaker_opens_after_consecutive_failures_lets_one_probe_and_closes_on_success() {
    let l = limit(
        None,
        None,
        Some(Breaker {
            failures: 2,
            cooldown_ms: 500,
        }),
    );
    let mut load = Load::default();
    l.record(&mut load, Outcome::Failed, at(0));
    assert_eq!(l.breaker_state(&load, at(0)), BreakerState::Closed);
    l.record(&mut load, Outcome::Failed, at(10));
    assert_eq!(l.breaker_state(&load, at(10)), BreakerState::Open);
    assert!(matches!(
        l.admit(&mut load, &cmd(1), at(509)),
        Err(Blocked::Open { .. })
    ));
    assert_eq!(l.breaker_state(&load, at(510)), BreakerState::HalfOpen);
    assert!(l.admit(&mut load, &cmd(1), at(510)).is_ok());
    assert_eq!(load.probe, Some(cmd(1)));
    assert!(matches!(
        l.admit(&mut load, &cmd(2), at(511)),
        Err(Blocked::Probing { .. })
    ));
    l.record(&mut load, Outcome::Failed, at(600));
    assert!(matches!(
        l.admit(&mut load, &cmd(2), at(700)),
        Err(Blocked::Open { .. })
    ));
    assert!(l.admit(&mut load, &cmd(2), at(1_100)).is_ok());
    l.record(&mut load, Outcome::Succeeded, at(1_200));
    assert_eq!(l.breaker_state(&load, at(1_200)), BreakerState::Closed);
    assert_eq!(load.probe, None);
}

#[test]
fn an_expired_probe_lets_another_in() {
    let l = limit(
        None,
        None,
        Some(Breaker {
            failures: 1,
            cooldown_ms: 100,
        }),
    );
    let mut load = Load::default();
    l.record(&mut load, Outcome::Failed, at(0));
    assert!(l.admit(&mut load, &cmd(1), at(100)).is_ok());
    load.probing = false; // its lease expired: the ledger reads it so
    assert!(l.admit(&mut load, &cmd(2), at(200)).is_ok());
    assert_eq!(load.probe, Some(cmd(2)));
}

#[test]
fn recent_entries_round_trip_through_their_stored_form() {
    let recent: VecDeque<Timestamp> = [1_700_000_000_000, 1_700_000_000_020, 1_700_000_000_020].map(at).into();
    let text = encode_recent(&recent);
    assert_eq!(text, "1700000000000,20,0");
    assert_eq!(decode_recent(&text).unwrap(), recent);
    assert_eq!(decode_recent("").unwrap(), VecDeque::new());
    assert_eq!(decode_recent("x"), None);
}
