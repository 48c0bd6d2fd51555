-- leasehold PostgreSQL schema, version 9: enqueue keys.
--
-- An enqueue may carry a key its caller chose (an API request's `Idempotency-Key`,
-- `enqueue --key`): another enqueue with the same key answers the attempt the first
-- one enqueued, and one with the same key but another request is refused.
-- `request_sha256` is the SHA-256 of the request that enqueued it (plan, action,
-- start as asked for). A key names one attempt: the unique constraint holds that
-- across plans and races. NULL on attempts enqueued without a key (and before this
-- version).
ALTER TABLE attempt ADD COLUMN enqueue_key TEXT COLLATE "C";
ALTER TABLE attempt ADD COLUMN request_sha256 TEXT COLLATE "C";
ALTER TABLE attempt ADD CONSTRAINT attempt_by_enqueue_key UNIQUE (enqueue_key);
