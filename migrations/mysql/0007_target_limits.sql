-- leasehold MySQL/MariaDB schema, version 7: per-target limits.
--
-- One row per limited target: its limits (NULL: none of that kind) and what its
-- admissions keep — the instants of its latest entries (`recent`, for the rate),
-- its breaker's consecutive failures, open-until and probe — and until when it
-- refuses every entry (`blocked_until`, which a claim's candidates leave out).
CREATE TABLE IF NOT EXISTS target_limit (
    target              VARCHAR(300) NOT NULL,
    max_in_flight       BIGINT       NULL,
    rate_count          BIGINT       NULL,
    rate_per_ms         BIGINT       NULL,
    breaker_failures    BIGINT       NULL,
    breaker_cooldown_ms BIGINT       NULL,
    recent              LONGTEXT     NOT NULL,
    failures            BIGINT       NOT NULL DEFAULT 0,
    open_until          BIGINT       NULL,
    probe               VARCHAR(255) NULL,
    blocked_until       BIGINT       NULL,
    updated_at          BIGINT       NOT NULL,
    PRIMARY KEY (target)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A limited target's slots, one per lease it admits at once (`max_in_flight`): free,
-- or held by the command whose lease took it (free again once that command holds
-- no live lease on the target).
CREATE TABLE IF NOT EXISTS target_slot (
    target     VARCHAR(300) NOT NULL,
    slot       BIGINT       NOT NULL,
    command_id VARCHAR(255) NULL,
    PRIMARY KEY (target, slot)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A target's live leases are counted on every admission onto it.
ALTER TABLE command ADD INDEX command_leased_by_target (target, status, lease_until);
