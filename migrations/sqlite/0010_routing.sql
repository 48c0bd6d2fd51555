-- leasehold SQLite schema, version 10: routing by queue, executor and target, and the
-- fleet's rows.
--
-- A plan may name a queue (`plan.queue`, NULL: the default queue). Each receipt keeps
-- the executor and target of its step as enqueued; each command carries its plan's
-- queue and the executor and target of the step it runs next, so that a claim takes
-- only what the claiming worker can run. Rows written before this version keep ''
-- there: any worker's claim may consider them, and the engine decides from the plan.
ALTER TABLE plan ADD COLUMN queue TEXT;
ALTER TABLE command ADD COLUMN queue TEXT NOT NULL DEFAULT '';
ALTER TABLE command ADD COLUMN executor TEXT NOT NULL DEFAULT '';
ALTER TABLE command ADD COLUMN target TEXT NOT NULL DEFAULT '';
ALTER TABLE receipt ADD COLUMN executor TEXT NOT NULL DEFAULT '';
ALTER TABLE receipt ADD COLUMN target TEXT NOT NULL DEFAULT '';

-- A claim filters its range of PENDING commands by route: the index holds it.
DROP INDEX command_pending;
CREATE INDEX command_pending ON command (available_at, id, queue, executor, target) WHERE status = 'PENDING';

-- One row per worker: what it can run (canonical JSON of its capabilities), when it
-- started and when it last reported (ledger clock, ms).
CREATE TABLE worker (
    id                TEXT    NOT NULL PRIMARY KEY,
    capabilities_json TEXT    NOT NULL,
    started_at        INTEGER NOT NULL,
    last_seen_at      INTEGER NOT NULL
);
