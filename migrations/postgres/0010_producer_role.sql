-- leasehold PostgreSQL schema, version 10: the producer role.
--
-- A `producer` token may enqueue attempts and nothing else: the role check of
-- `api_token` (named by PostgreSQL when the table was created) admits it.
ALTER TABLE api_token DROP CONSTRAINT api_token_role_check;
ALTER TABLE api_token ADD CONSTRAINT api_token_role_check
    CHECK (role IN ('viewer', 'producer', 'operator', 'admin'));
