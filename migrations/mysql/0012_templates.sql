-- leasehold MySQL / MariaDB schema, version 12: templates and ordered keys.
--
-- A plan that declares `[input]` is a template: `plan.input_json` holds that table
-- (canonical JSON) and `plan.on_failure` what an ordered key does when an attempt
-- fails (`block` or `continue`; NULL for a plan that sets none). Each of its
-- attempts carries its input (`attempt.input_json`, canonical JSON, at most 64 KiB)
-- and the input's SHA-256, and each receipt the payload its step resolved from that
-- input (`receipt.payload`), frozen at enqueue. NULL on plans, attempts and receipts
-- without input.
--
-- `attempt.order_key` orders a template's attempts: one per (plan, order key) is
-- claimable at a time. An attempt enqueued behind an open one has a WAITING
-- command, which no claim takes, until the one ahead ends.
ALTER TABLE plan ADD COLUMN input_json MEDIUMTEXT NULL;
ALTER TABLE plan ADD COLUMN on_failure VARCHAR(16) NULL;
ALTER TABLE plan ADD CONSTRAINT plan_on_failure CHECK (on_failure IN ('block', 'continue'));
ALTER TABLE attempt ADD COLUMN input_json MEDIUMTEXT NULL;
ALTER TABLE attempt ADD COLUMN input_sha256 CHAR(64) NULL;
ALTER TABLE attempt ADD COLUMN order_key VARCHAR(255) NULL;
ALTER TABLE receipt ADD COLUMN payload MEDIUMTEXT NULL;

-- An enqueue finds the open attempt ahead on its key; an ending head, the ones
-- waiting behind it, in enqueue order.
ALTER TABLE attempt ADD KEY attempt_by_order_key (plan_id, order_key, number);

-- WAITING: behind an open attempt with the same order key. The status check was
-- created without a name, and MariaDB and MySQL name such a check differently: it
-- is found by its table and its clause in information_schema and dropped by the
-- name found.
SET @leasehold_status_check = (
    SELECT cc.CONSTRAINT_NAME FROM information_schema.CHECK_CONSTRAINTS cc
    JOIN information_schema.TABLE_CONSTRAINTS tc
      ON tc.CONSTRAINT_SCHEMA = cc.CONSTRAINT_SCHEMA AND tc.CONSTRAINT_NAME = cc.CONSTRAINT_NAME
    WHERE cc.CONSTRAINT_SCHEMA = DATABASE() AND tc.TABLE_NAME = 'command' AND tc.CONSTRAINT_TYPE = 'CHECK'
      AND cc.CHECK_CLAUSE LIKE '%DELIVERED%'
    LIMIT 1
);
SET @leasehold_drop = CONCAT('ALTER TABLE command DROP CONSTRAINT `', @leasehold_status_check, '`');
PREPARE leasehold_drop FROM @leasehold_drop;
EXECUTE leasehold_drop;
DEALLOCATE PREPARE leasehold_drop;
ALTER TABLE command ADD CONSTRAINT command_status
    CHECK (status IN ('PENDING', 'PROCESSING', 'DELIVERED', 'FAILED', 'ABORTED', 'WAITING'));
