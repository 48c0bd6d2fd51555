-- leasehold SQLite schema, version 4: API tokens for `leasehold serve`, and the
-- console's listing order.
--
-- A token is stored only as the SHA-256 of its secret (64 lowercase hex digits); the
-- secret itself is shown once, when it is created, and never stored. A revoked token
-- keeps its row (and its name) with revoked_at set.

CREATE TABLE api_token (
    name       TEXT    NOT NULL PRIMARY KEY,
    role       TEXT    NOT NULL CHECK (role = 'viewer' OR role = 'operator' OR role = 'admin'),
    sha256     TEXT    NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);

-- The console and GET /api/v1/attempts list attempts newest first, a page at a time
-- (keyset pagination on (created_at, id)). Both columns are written once, at enqueue:
-- the index costs an insert per attempt and nothing on any later transition.
CREATE INDEX attempt_by_created ON attempt (created_at, id);

-- Capped counts per state (GET /api/v1/counts, the console, /metrics) and pages
-- filtered by a failed state: FAILED and ABORTED attempts are the few, so these
-- partial indexes hold only them, newest last. An attempt enters one at most once,
-- when it fails or is aborted; no delivery that succeeds writes to either.
CREATE INDEX attempt_failed ON attempt (created_at, id) WHERE status = 'FAILED';
CREATE INDEX attempt_aborted ON attempt (created_at, id) WHERE status = 'ABORTED';
