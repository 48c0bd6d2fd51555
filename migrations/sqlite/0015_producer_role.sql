-- leasehold SQLite schema, version 15: the producer role.
--
-- A `producer` token may enqueue attempts and nothing else. SQLite cannot change a
-- CHECK constraint in place, so `api_token` is rebuilt with the same columns and rows
-- and a role check that admits it.
CREATE TABLE api_token_next (
    name       TEXT    NOT NULL PRIMARY KEY,
    role       TEXT    NOT NULL
        CHECK (role = 'viewer' OR role = 'producer' OR role = 'operator' OR role = 'admin'),
    sha256     TEXT    NOT NULL UNIQUE,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
INSERT INTO api_token_next (name, role, sha256, created_at, revoked_at)
    SELECT name, role, sha256, created_at, revoked_at FROM api_token;
DROP TABLE api_token;
ALTER TABLE api_token_next RENAME TO api_token;
