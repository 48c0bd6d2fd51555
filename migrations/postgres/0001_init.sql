-- leasehold PostgreSQL schema, version 1.
--
-- The same tables, columns and constraints as the SQLite and MySQL schemas (the
-- schema-parity test checks it). Timestamps are BIGINT milliseconds since the Unix
-- epoch (leasehold_engine::Timestamp), read from the database's clock. Every text
-- column uses the "C" collation, so ids, keys and tokens compare and sort byte by
-- byte, as SQLite's BINARY and MySQL's utf8mb4_bin do (keyset pagination relies on it).

CREATE TABLE plan (
    -- Registration order (SQLite's rowid, MySQL's AUTO_INCREMENT seq).
    seq                  BIGINT GENERATED ALWAYS AS IDENTITY,
    id                   TEXT COLLATE "C" NOT NULL,
    name                 TEXT COLLATE "C" NOT NULL,
    status               TEXT COLLATE "C" NOT NULL,
    recovery             TEXT COLLATE "C" NOT NULL,
    steps_json           TEXT COLLATE "C" NOT NULL,
    volatile_fields_json TEXT COLLATE "C" NOT NULL,
    fingerprint          TEXT COLLATE "C" NOT NULL,
    created_at           BIGINT NOT NULL,
    PRIMARY KEY (id),
    CONSTRAINT plan_by_seq UNIQUE (seq),
    CHECK (status IN ('READY', 'RETIRED')),
    CHECK (recovery IN ('resume', 'replay'))
);

-- register_plan looks up READY plans by fingerprint (idempotent registration).
CREATE INDEX plan_by_fingerprint ON plan (fingerprint, status);

CREATE TABLE attempt (
    id          TEXT COLLATE "C" NOT NULL,
    plan_id     TEXT COLLATE "C" NOT NULL REFERENCES plan (id),
    number      BIGINT NOT NULL,
    action      TEXT COLLATE "C" NOT NULL,
    status      TEXT COLLATE "C" NOT NULL,
    created_at  BIGINT NOT NULL,
    started_at  BIGINT,
    finished_at BIGINT,
    error       TEXT COLLATE "C",
    PRIMARY KEY (id),
    -- history reads a plan's attempts by number; numbers are unique per plan.
    CONSTRAINT attempt_by_plan_number UNIQUE (plan_id, number),
    CHECK (number >= 1),
    CHECK (action IN ('execute', 'retry', 'compensate')),
    CHECK (status IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'ABORTED'))
);

-- The console's listing: newest first by (created_at, id), and the failed and
-- aborted pages and counts without reading the other attempts.
CREATE INDEX attempt_by_created ON attempt (created_at, id);
CREATE INDEX attempt_failed ON attempt (created_at, id) WHERE status = 'FAILED';
CREATE INDEX attempt_aborted ON attempt (created_at, id) WHERE status = 'ABORTED';
-- open_attempts counts QUEUED and RUNNING attempts (every idle worker poll).
CREATE INDEX attempt_open ON attempt (status) WHERE status IN ('QUEUED', 'RUNNING');

CREATE TABLE receipt (
    attempt_id      TEXT COLLATE "C" NOT NULL REFERENCES attempt (id),
    ordinal         BIGINT NOT NULL,
    step_code       TEXT COLLATE "C" NOT NULL,
    idempotency_key TEXT COLLATE "C" NOT NULL,
    status          TEXT COLLATE "C" NOT NULL,
    evidence        TEXT COLLATE "C",
    evidence_sha256 TEXT COLLATE "C",
    target_receipt  TEXT COLLATE "C",
    error           TEXT COLLATE "C",
    started_at      BIGINT,
    finished_at     BIGINT,
    -- Every transition reads (and locks) an attempt's receipts in ordinal order.
    PRIMARY KEY (attempt_id, ordinal),
    CHECK (ordinal >= 1),
    CHECK (status IN ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'ABORTED')),
    -- Evidence is never stored without its fingerprint, nor the other way round.
    CHECK ((evidence IS NULL) = (evidence_sha256 IS NULL))
);

CREATE TABLE command (
    id                TEXT COLLATE "C" NOT NULL,
    attempt_id        TEXT COLLATE "C" NOT NULL REFERENCES attempt (id),
    status            TEXT COLLATE "C" NOT NULL,
    available_at      BIGINT NOT NULL,
    lease_owner       TEXT COLLATE "C",
    lease_token       TEXT COLLATE "C",
    lease_until       BIGINT,
    last_heartbeat_at BIGINT,
    delivery_count    BIGINT NOT NULL DEFAULT 0,
    last_error        TEXT COLLATE "C",
    finished_at       BIGINT,
    PRIMARY KEY (id),
    -- Exactly one command per attempt; every transition finds (and locks) it by attempt.
    CONSTRAINT command_by_attempt UNIQUE (attempt_id),
    CHECK (status IN ('PENDING', 'PROCESSING', 'DELIVERED', 'FAILED', 'ABORTED')),
    CHECK (delivery_count >= 0),
    -- A held command always has a fencing token and a deadline.
    CHECK (status <> 'PROCESSING' OR (lease_token IS NOT NULL AND lease_until IS NOT NULL))
);

-- Claims: PENDING commands whose available_at has passed, oldest first (the claim's
-- CTE reads this index and skips locked rows).
CREATE INDEX command_pending ON command (available_at, id) INCLUDE (attempt_id) WHERE status = 'PENDING';
-- Takeovers and reconcile: PROCESSING commands whose lease_until has passed.
CREATE INDEX command_leased ON command (lease_until) WHERE status = 'PROCESSING';

-- API tokens for `leasehold serve`: only a SHA-256 of each token is stored.
CREATE TABLE api_token (
    name       TEXT COLLATE "C" NOT NULL,
    role       TEXT COLLATE "C" NOT NULL,
    sha256     TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT,
    PRIMARY KEY (name),
    CONSTRAINT api_token_by_sha256 UNIQUE (sha256),
    CHECK (role IN ('viewer', 'operator', 'admin'))
);
