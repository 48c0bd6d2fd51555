-- leasehold MySQL schema, version 6: routing by queue, executor and target, and the
-- fleet's rows.
--
-- A plan may name a queue (`plan.queue`, NULL: the default queue). Each receipt keeps
-- the executor and target of its step as enqueued; each command carries its plan's
-- queue and the executor and target of the step it runs next, so that a claim takes
-- only what the claiming worker can run. Rows written before this version keep ''
-- there: any worker's claim may consider them, and the engine decides from the plan.
-- Names are at most 200 characters; an http:v1 target at most 8 + 253 + 6.
ALTER TABLE plan ADD COLUMN queue VARCHAR(200) NULL;
ALTER TABLE command ADD COLUMN queue VARCHAR(200) NOT NULL DEFAULT '';
ALTER TABLE command ADD COLUMN executor VARCHAR(200) NOT NULL DEFAULT '';
ALTER TABLE command ADD COLUMN target VARCHAR(300) NOT NULL DEFAULT '';
ALTER TABLE receipt ADD COLUMN executor VARCHAR(200) NOT NULL DEFAULT '';
ALTER TABLE receipt ADD COLUMN target VARCHAR(300) NOT NULL DEFAULT '';

-- A claim filters its window by route: the covering index holds the queue and the
-- executor (the target too would pass InnoDB's 3,072-byte key limit; it is read from
-- the row, and only where the executor is limited to some targets).
ALTER TABLE command
    DROP INDEX command_claimable,
    ADD INDEX command_claimable (status, available_at, id, attempt_id, queue, executor);

-- One row per worker: what it can run (canonical JSON of its capabilities), when it
-- started and when it last reported (ledger clock, ms).
CREATE TABLE IF NOT EXISTS worker (
    id                VARCHAR(255) NOT NULL,
    capabilities_json LONGTEXT     NOT NULL,
    started_at        BIGINT       NOT NULL,
    last_seen_at      BIGINT       NOT NULL,
    PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
