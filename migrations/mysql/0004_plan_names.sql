-- leasehold MySQL / MariaDB schema, version 4: plans found by name.
--
-- `history`, `gate`, the API and the console accept a plan's name where they accept
-- its id; without an index each such lookup read every plan. `name` is TEXT, so the
-- index keeps a prefix (191 characters, within every InnoDB row format's key limit in
-- utf8mb4); a lookup checks the whole name on the rows it finds.
--
-- Idempotent, like every migration here: MySQL 8 has no CREATE INDEX IF NOT EXISTS,
-- so the statement is chosen from the catalogue (a run cut short after the index was
-- built but before its version was recorded creates nothing the second time).
SET @leasehold_ddl = (
    SELECT IF(COUNT(*) = 0, 'CREATE INDEX plan_by_name ON plan (name(191))', 'DO 0')
    FROM information_schema.statistics
    WHERE table_schema = DATABASE() AND table_name = 'plan' AND index_name = 'plan_by_name'
);
PREPARE leasehold_ddl FROM @leasehold_ddl;
EXECUTE leasehold_ddl;
DEALLOCATE PREPARE leasehold_ddl;
