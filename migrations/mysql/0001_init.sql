-- leasehold MySQL / MariaDB schema, version 1.
--
-- The same tables and columns as migrations/sqlite/0001_init.sql, for InnoDB.
-- Timestamps are BIGINT milliseconds since the Unix epoch (leasehold_engine::Timestamp),
-- read from the database's clock. Statuses are stored as the engine's text values; the
-- CHECK constraints mirror the engine's enumerations (enforced by MariaDB 10.2+ and
-- MySQL 8.0.16+, parsed and ignored by MySQL 5.7). Every text column uses utf8mb4_bin,
-- so that ids, fingerprints and lease tokens compare byte for byte (a case-insensitive
-- collation would let a token match another token that differs only in case).
--
-- Every statement is idempotent (IF NOT EXISTS) and every index is declared inside its
-- CREATE TABLE: MySQL runs DDL outside transactions, so a migration that was cut short
-- must be able to run again from the top.

-- seq only orders plans by registration (SQLite has its rowid for that).
CREATE TABLE IF NOT EXISTS plan (
    seq                  BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    id                   VARCHAR(64)     NOT NULL,
    name                 TEXT            NOT NULL,
    status               VARCHAR(16)     NOT NULL,
    recovery             VARCHAR(16)     NOT NULL,
    steps_json           LONGTEXT        NOT NULL,
    volatile_fields_json TEXT            NOT NULL,
    fingerprint          CHAR(64)        NOT NULL,
    created_at           BIGINT          NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY plan_by_seq (seq),
    -- register_plan looks up READY plans by fingerprint (idempotent registration);
    -- its locking read also serializes two registrations of the same content.
    KEY plan_by_fingerprint (fingerprint, status),
    CHECK (status IN ('READY', 'RETIRED')),
    CHECK (recovery IN ('resume', 'replay'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS attempt (
    id          VARCHAR(64)  NOT NULL,
    plan_id     VARCHAR(64)  NOT NULL,
    number      INT UNSIGNED NOT NULL,
    action      VARCHAR(16)  NOT NULL,
    status      VARCHAR(16)  NOT NULL,
    created_at  BIGINT       NOT NULL,
    started_at  BIGINT       NULL,
    finished_at BIGINT       NULL,
    error       TEXT         NULL,
    PRIMARY KEY (id),
    -- history reads a plan's attempts by number; numbers are unique per plan.
    UNIQUE KEY attempt_by_plan_number (plan_id, number),
    -- open_attempts counts QUEUED and RUNNING attempts (every idle worker poll).
    KEY attempt_by_status (status),
    FOREIGN KEY (plan_id) REFERENCES plan (id),
    CHECK (number >= 1),
    CHECK (action IN ('execute', 'retry', 'compensate')),
    CHECK (status IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'ABORTED'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS receipt (
    attempt_id      VARCHAR(64)  NOT NULL,
    ordinal         INT UNSIGNED NOT NULL,
    step_code       TEXT         NOT NULL,
    idempotency_key VARCHAR(64)  NOT NULL,
    status          VARCHAR(16)  NOT NULL,
    evidence        LONGTEXT     NULL,
    evidence_sha256 CHAR(64)     NULL,
    target_receipt  LONGTEXT     NULL,
    error           TEXT         NULL,
    started_at      BIGINT       NULL,
    finished_at     BIGINT       NULL,
    -- Every transition reads (and locks) an attempt's receipts in ordinal order.
    PRIMARY KEY (attempt_id, ordinal),
    FOREIGN KEY (attempt_id) REFERENCES attempt (id),
    CHECK (ordinal >= 1),
    CHECK (status IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'ABORTED')),
    -- Evidence is never stored without its fingerprint, nor the other way round.
    CHECK ((evidence IS NULL) = (evidence_sha256 IS NULL))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS command (
    id                VARCHAR(64)  NOT NULL,
    attempt_id        VARCHAR(64)  NOT NULL,
    status            VARCHAR(16)  NOT NULL,
    available_at      BIGINT       NOT NULL,
    lease_owner       TEXT         NULL,
    lease_token       VARCHAR(64)  NULL,
    lease_until       BIGINT       NULL,
    last_heartbeat_at BIGINT       NULL,
    delivery_count    INT UNSIGNED NOT NULL DEFAULT 0,
    last_error        TEXT         NULL,
    finished_at       BIGINT       NULL,
    PRIMARY KEY (id),
    -- Exactly one command per attempt; every transition finds (and locks) it by attempt.
    UNIQUE KEY command_by_attempt (attempt_id),
    -- Claims: PENDING commands whose available_at has passed, oldest first.
    KEY command_claimable (status, available_at),
    -- Takeovers: PROCESSING commands whose lease_until has passed.
    KEY command_expired (status, lease_until),
    FOREIGN KEY (attempt_id) REFERENCES attempt (id),
    CHECK (status IN ('PENDING', 'PROCESSING', 'DELIVERED', 'FAILED', 'ABORTED')),
    -- A held command always has a fencing token and a deadline.
    CHECK (status <> 'PROCESSING' OR (lease_token IS NOT NULL AND lease_until IS NOT NULL))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
