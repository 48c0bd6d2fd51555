-- leasehold SQLite schema, version 1.
--
-- Timestamps are INTEGER milliseconds since the Unix epoch (leasehold_engine::Timestamp),
-- read from the ledger's clock. Statuses are stored as the engine's text values; the
-- CHECK constraints mirror the engine's enumerations so that a stray write fails loudly.

CREATE TABLE plan (
    id                   TEXT    NOT NULL PRIMARY KEY,
    name                 TEXT    NOT NULL,
    status               TEXT    NOT NULL CHECK (status IN ('READY', 'RETIRED')),
    recovery             TEXT    NOT NULL CHECK (recovery IN ('resume', 'replay')),
    steps_json           TEXT    NOT NULL,
    volatile_fields_json TEXT    NOT NULL,
    fingerprint          TEXT    NOT NULL,
    created_at           INTEGER NOT NULL
);

-- register_plan looks up READY plans by fingerprint (idempotent registration).
CREATE INDEX plan_by_fingerprint ON plan (fingerprint, status);

CREATE TABLE attempt (
    id          TEXT    NOT NULL PRIMARY KEY,
    plan_id     TEXT    NOT NULL REFERENCES plan (id),
    number      INTEGER NOT NULL CHECK (number >= 1),
    action      TEXT    NOT NULL CHECK (action IN ('execute', 'retry', 'compensate')),
    status      TEXT    NOT NULL CHECK (status IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'ABORTED')),
    created_at  INTEGER NOT NULL,
    started_at  INTEGER,
    finished_at INTEGER,
    error       TEXT,
    UNIQUE (plan_id, number)
);

-- open_attempts counts QUEUED and RUNNING attempts.
CREATE INDEX attempt_by_status ON attempt (status);

CREATE TABLE receipt (
    attempt_id      TEXT    NOT NULL REFERENCES attempt (id),
    ordinal         INTEGER NOT NULL CHECK (ordinal >= 1),
    step_code       TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'ABORTED')),
    evidence        TEXT,
    evidence_sha256 TEXT,
    target_receipt  TEXT,
    error           TEXT,
    started_at      INTEGER,
    finished_at     INTEGER,
    PRIMARY KEY (attempt_id, ordinal),
    -- Evidence is never stored without its fingerprint, nor the other way round.
    CHECK ((evidence IS NULL) = (evidence_sha256 IS NULL))
);

CREATE TABLE command (
    id                TEXT    NOT NULL PRIMARY KEY,
    attempt_id        TEXT    NOT NULL UNIQUE REFERENCES attempt (id),
    status            TEXT    NOT NULL CHECK (status IN ('PENDING', 'PROCESSING', 'DELIVERED', 'FAILED', 'ABORTED')),
    available_at      INTEGER NOT NULL,
    lease_owner       TEXT,
    lease_token       TEXT,
    lease_until       INTEGER,
    last_heartbeat_at INTEGER,
    delivery_count    INTEGER NOT NULL DEFAULT 0 CHECK (delivery_count >= 0),
    last_error        TEXT,
    finished_at       INTEGER,
    -- A held command always has a fencing token and a deadline.
    CHECK (status <> 'PROCESSING' OR (lease_token IS NOT NULL AND lease_until IS NOT NULL))
);

-- Claims: PENDING commands whose available_at has passed, oldest first.
CREATE INDEX command_claimable ON command (status, available_at);
-- Takeovers and reconcile: PROCESSING commands whose lease_until has passed.
CREATE INDEX command_expired ON command (status, lease_until);
