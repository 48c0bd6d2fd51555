-- leasehold SQLite schema, version 16: templates and ordered keys.
--
-- A plan that declares `[input]` is a template: `plan.input_json` holds that table
-- (canonical JSON) and `plan.on_failure` what an ordered key does when an attempt
-- fails (`block` or `continue`; NULL for a plan that sets none). Each of its
-- attempts carries its input (`attempt.input_json`, canonical JSON) and the input's
-- SHA-256, and each receipt the payload its step resolved from that input
-- (`receipt.payload`), frozen at enqueue. NULL on plans, attempts and receipts
-- without input.
--
-- `attempt.order_key` orders a template's attempts: one per (plan, order key) is
-- claimable at a time. An attempt enqueued behind an open one has a WAITING
-- command, which no claim takes, until the one ahead ends.
ALTER TABLE plan ADD COLUMN input_json TEXT;
ALTER TABLE plan ADD COLUMN on_failure TEXT CHECK (on_failure IS NULL OR on_failure = 'block' OR on_failure = 'continue');
ALTER TABLE attempt ADD COLUMN input_json TEXT;
ALTER TABLE attempt ADD COLUMN input_sha256 TEXT;
ALTER TABLE attempt ADD COLUMN order_key TEXT;
ALTER TABLE receipt ADD COLUMN payload TEXT;

-- An enqueue finds the open attempt ahead on its key; an ending head, the ones
-- waiting behind it, in enqueue order.
CREATE INDEX attempt_by_order_key ON attempt (plan_id, order_key, number) WHERE order_key IS NOT NULL;

-- WAITING: behind an open attempt with the same order key. SQLite cannot alter a
-- CHECK constraint: the command table is rebuilt as version 3 did (leasehold runs
-- migrations with foreign keys off, in one transaction, and checks every foreign
-- key before it commits). Rows keep their ids, values and order; the indexes are
-- created again as they were.
CREATE TABLE command_v16 (
    id                TEXT    NOT NULL PRIMARY KEY,
    attempt_id        TEXT    NOT NULL UNIQUE REFERENCES attempt (id),
    status            TEXT    NOT NULL CHECK (status = 'PENDING' OR status = 'PROCESSING' OR status = 'DELIVERED'
                                              OR status = 'FAILED' OR status = 'ABORTED' OR status = 'WAITING'),
    available_at      INTEGER NOT NULL,
    lease_owner       TEXT,
    lease_token       TEXT,
    lease_until       INTEGER,
    last_heartbeat_at INTEGER,
    delivery_count    INTEGER NOT NULL DEFAULT 0 CHECK (delivery_count >= 0),
    last_error        TEXT,
    finished_at       INTEGER,
    room              BLOB,
    queue             TEXT    NOT NULL DEFAULT '',
    executor          TEXT    NOT NULL DEFAULT '',
    target            TEXT    NOT NULL DEFAULT '',
    -- A held command always has a fencing token and a deadline.
    CHECK (status <> 'PROCESSING' OR (lease_token IS NOT NULL AND lease_until IS NOT NULL))
);
INSERT INTO command_v16 (id, attempt_id, status, available_at, lease_owner, lease_token, lease_until,
                         last_heartbeat_at, delivery_count, last_error, finished_at, room, queue, executor, target)
    SELECT id, attempt_id, status, available_at, lease_owner, lease_token, lease_until,
           last_heartbeat_at, delivery_count, last_error, finished_at, room, queue, executor, target
    FROM command ORDER BY rowid;
DROP TABLE command;
ALTER TABLE command_v16 RENAME TO command;
CREATE INDEX command_pending ON command (available_at, id, queue, executor, target) WHERE status = 'PENDING';
CREATE INDEX command_leased ON command (lease_until) WHERE status = 'PROCESSING';
CREATE INDEX command_leased_by_target ON command (target, lease_until) WHERE status = 'PROCESSING';
-- Open attempts are counted by their commands, each status by an index of its own.
CREATE INDEX command_waiting ON command (id) WHERE status = 'WAITING';
