-- leasehold SQLite schema, version 3: CHECK constraints SQLite evaluates without a
-- temporary table.
--
-- Versions 1 and 2 checked the enumerations with `col IN ('A', 'B', …)`. SQLite
-- evaluates an IN list of more than two constants by building a temporary B-tree of
-- the list every time the statement runs, and it runs a column's CHECK on every
-- INSERT and on every UPDATE that sets the column: each claim, step and finish built
-- three of them (attempt, command, receipt), about a fifth of a transition's CPU.
-- The same checks written as `col = 'A' OR col = 'B' OR …` admit exactly the same
-- values and compile to a few comparisons.
--
-- SQLite cannot alter a CHECK constraint: each table is rebuilt (create the new
-- table, copy every row, drop the old one, rename; see "Making Other Kinds Of Table
-- Schema Changes" in SQLite's ALTER TABLE documentation). leasehold runs migrations
-- with foreign keys off, in one transaction, and checks every foreign key
-- (`PRAGMA foreign_key_check`) before it commits. Rows keep their ids, values and
-- order; the indexes are created again as version 2 left them.

CREATE TABLE attempt_v3 (
    id          TEXT    NOT NULL PRIMARY KEY,
    plan_id     TEXT    NOT NULL REFERENCES plan (id),
    number      INTEGER NOT NULL CHECK (number >= 1),
    action      TEXT    NOT NULL CHECK (action = 'execute' OR action = 'retry' OR action = 'compensate'),
    status      TEXT    NOT NULL CHECK (status = 'QUEUED' OR status = 'RUNNING' OR status = 'SUCCEEDED'
                                        OR status = 'FAILED' OR status = 'ABORTED'),
    created_at  INTEGER NOT NULL,
    started_at  INTEGER,
    finished_at INTEGER,
    error       TEXT,
    UNIQUE (plan_id, number)
);
INSERT INTO attempt_v3 (id, plan_id, number, action, status, created_at, started_at, finished_at, error)
    SELECT id, plan_id, number, action, status, created_at, started_at, finished_at, error
    FROM attempt ORDER BY rowid;

CREATE TABLE receipt_v3 (
    attempt_id      TEXT    NOT NULL REFERENCES attempt (id),
    ordinal         INTEGER NOT NULL CHECK (ordinal >= 1),
    step_code       TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status = 'PENDING' OR status = 'RUNNING' OR status = 'SUCCEEDED'
                                            OR status = 'FAILED' OR status = 'ABORTED'),
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
INSERT INTO receipt_v3 (attempt_id, ordinal, step_code, idempotency_key, status, evidence, evidence_sha256,
                        target_receipt, error, started_at, finished_at)
    SELECT attempt_id, ordinal, step_code, idempotency_key, status, evidence, evidence_sha256,
           target_receipt, error, started_at, finished_at
    FROM receipt ORDER BY rowid;

CREATE TABLE command_v3 (
    id                TEXT    NOT NULL PRIMARY KEY,
    attempt_id        TEXT    NOT NULL UNIQUE REFERENCES attempt (id),
    status            TEXT    NOT NULL CHECK (status = 'PENDING' OR status = 'PROCESSING' OR status = 'DELIVERED'
                                              OR status = 'FAILED' OR status = 'ABORTED'),
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
INSERT INTO command_v3 (id, attempt_id, status, available_at, lease_owner, lease_token, lease_until,
                        last_heartbeat_at, delivery_count, last_error, finished_at)
    SELECT id, attempt_id, status, available_at, lease_owner, lease_token, lease_until,
           last_heartbeat_at, delivery_count, last_error, finished_at
    FROM command ORDER BY rowid;

DROP TABLE command;
DROP TABLE receipt;
DROP TABLE attempt;
ALTER TABLE attempt_v3 RENAME TO attempt;
ALTER TABLE receipt_v3 RENAME TO receipt;
ALTER TABLE command_v3 RENAME TO command;

-- Claims: PENDING commands whose available_at has passed, oldest first, then by id.
CREATE INDEX command_pending ON command (available_at, id) WHERE status = 'PENDING';
-- Takeovers and reconcile: PROCESSING commands whose lease_until has passed.
CREATE INDEX command_leased ON command (lease_until) WHERE status = 'PROCESSING';
