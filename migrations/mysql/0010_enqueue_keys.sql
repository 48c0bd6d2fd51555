-- leasehold MySQL schema, version 10: enqueue keys.
--
-- An enqueue may carry a key its caller chose (an API request's `Idempotency-Key`,
-- `enqueue --key`): another enqueue with the same key answers the attempt the first
-- one enqueued, and one with the same key but another request is refused.
-- `request_sha256` is the SHA-256 of the request that enqueued it (plan, action,
-- start as asked for). A key names one attempt: the unique key holds that across
-- plans and races. NULL on attempts enqueued without a key (and before this version).
-- A key is at most 255 characters; utf8mb4 keeps the index within InnoDB's limit.
ALTER TABLE attempt ADD COLUMN enqueue_key VARCHAR(255) NULL;
ALTER TABLE attempt ADD COLUMN request_sha256 CHAR(64) NULL;
ALTER TABLE attempt ADD UNIQUE KEY attempt_by_enqueue_key (enqueue_key);
