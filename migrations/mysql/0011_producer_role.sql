-- leasehold MySQL / MariaDB schema, version 11: the producer role.
--
-- A `producer` token may enqueue attempts and nothing else: the role check of
-- `api_token` admits it. The check was created without a name, and MariaDB and MySQL
-- name such a check differently (`CONSTRAINT_1`, `api_token_chk_1`): it is found by
-- table in information_schema and dropped by the name found.
SET @leasehold_role_check = (
    SELECT CONSTRAINT_NAME FROM information_schema.TABLE_CONSTRAINTS
    WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = 'api_token' AND CONSTRAINT_TYPE = 'CHECK'
    LIMIT 1
);
SET @leasehold_drop = CONCAT('ALTER TABLE api_token DROP CONSTRAINT `', @leasehold_role_check, '`');
PREPARE leasehold_drop FROM @leasehold_drop;
EXECUTE leasehold_drop;
DEALLOCATE PREPARE leasehold_drop;
ALTER TABLE api_token ADD CONSTRAINT api_token_role
    CHECK (role IN ('viewer', 'producer', 'operator', 'admin'));
