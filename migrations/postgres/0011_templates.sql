-- leasehold PostgreSQL schema, version 11: templates and ordered keys.
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
ALTER TABLE plan ADD COLUMN input_json TEXT COLLATE "C";
ALTER TABLE plan ADD COLUMN on_failure TEXT COLLATE "C";
ALTER TABLE plan ADD CONSTRAINT plan_on_failure_check CHECK (on_failure IN ('block', 'continue'));
ALTER TABLE attempt ADD COLUMN input_json TEXT COLLATE "C";
ALTER TABLE attempt ADD COLUMN input_sha256 TEXT COLLATE "C";
ALTER TABLE attempt ADD COLUMN order_key TEXT COLLATE "C";
ALTER TABLE receipt ADD COLUMN payload TEXT COLLATE "C";

-- An enqueue finds the open attempt ahead on its key; an ending head, the ones
-- waiting behind it, in enqueue order.
CREATE INDEX attempt_by_order_key ON attempt (plan_id, order_key, number) WHERE order_key IS NOT NULL;

-- WAITING: behind an open attempt with the same order key.
ALTER TABLE command DROP CONSTRAINT command_status_check;
ALTER TABLE command ADD CONSTRAINT command_status_check
    CHECK (status IN ('PENDING', 'PROCESSING', 'DELIVERED', 'FAILED', 'ABORTED', 'WAITING'));

-- Open attempts are counted by their commands, each status by an index of its own.
CREATE INDEX command_waiting ON command (id) WHERE status = 'WAITING';
