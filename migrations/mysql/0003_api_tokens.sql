-- leasehold MySQL / MariaDB schema, version 3: API tokens for `leasehold serve`.
--
-- The same table as migrations/sqlite/0004_api_tokens.sql. A token is stored only as
-- the SHA-256 of its secret (64 lowercase hex digits); the secret itself is shown
-- once, when it is created, and never stored. A revoked token keeps its row (and its
-- name) with revoked_at set. Idempotent (IF NOT EXISTS), like every migration here.

CREATE TABLE IF NOT EXISTS api_token (
    name       VARCHAR(64) NOT NULL,
    role       VARCHAR(16) NOT NULL,
    sha256     CHAR(64)    NOT NULL,
    created_at BIGINT      NOT NULL,
    revoked_at BIGINT      NULL,
    PRIMARY KEY (name),
    UNIQUE KEY api_token_by_sha256 (sha256),
    CHECK (role IN ('viewer', 'operator', 'admin'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
