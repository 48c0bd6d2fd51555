-- leasehold SQLite schema, version 11: per-target limits.
--
-- One row per limited target: its limits (NULL: none of that kind) and what its
-- admissions keep — the instants of its latest entries (`recent`, for the rate),
-- its breaker's consecutive failures, open-until and probe — and until when it
-- refuses every entry (`blocked_until`, which a claim's candidates leave out).
CREATE TABLE target_limit (
    target              TEXT    NOT NULL PRIMARY KEY,
    max_in_flight       INTEGER,
    rate_count          INTEGER,
    rate_per_ms         INTEGER,
    breaker_failures    INTEGER,
    breaker_cooldown_ms INTEGER,
    recent              TEXT    NOT NULL,
    failures            INTEGER NOT NULL DEFAULT 0,
    open_until          INTEGER,
    probe               TEXT,
    blocked_until       INTEGER,
    updated_at          INTEGER NOT NULL
);

-- A limited target's slots, one per lease it admits at once (`max_in_flight`): free,
-- or held by the command whose lease took it (free again once that command holds
-- no live lease on the target).
CREATE TABLE target_slot (
    target     TEXT    NOT NULL,
    slot       INTEGER NOT NULL,
    command_id TEXT,
    PRIMARY KEY (target, slot)
);

-- A target's live leases are counted on every admission onto it.
CREATE INDEX command_leased_by_target ON command (target, lease_until) WHERE status = 'PROCESSING';
