-- leasehold PostgreSQL schema, version 6: per-target limits.
--
-- One row per limited target: its limits (NULL: none of that kind) and what its
-- admissions keep — the instants of its latest entries (`recent`, for the rate),
-- its breaker's consecutive failures, open-until and probe — and until when it
-- refuses every entry (`blocked_until`, which a claim's candidates leave out).
CREATE TABLE target_limit (
    target              TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    max_in_flight       BIGINT,
    rate_count          BIGINT,
    rate_per_ms         BIGINT,
    breaker_failures    BIGINT,
    breaker_cooldown_ms BIGINT,
    recent              TEXT NOT NULL,
    failures            BIGINT NOT NULL DEFAULT 0,
    open_until          BIGINT,
    probe               TEXT COLLATE "C",
    blocked_until       BIGINT,
    updated_at          BIGINT NOT NULL
);

-- A limited target's slots, one per lease it admits at once (`max_in_flight`): free,
-- or held by the command whose lease took it (free again once that command holds
-- no live lease on the target).
CREATE TABLE target_slot (
    target     TEXT COLLATE "C" NOT NULL,
    slot       BIGINT NOT NULL,
    command_id TEXT COLLATE "C",
    PRIMARY KEY (target, slot)
);

-- A target's live leases are counted on every admission onto it.
CREATE INDEX command_leased_by_target ON command (target, lease_until) WHERE status = 'PROCESSING';
