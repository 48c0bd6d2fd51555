-- leasehold PostgreSQL schema, version 7: what a schema lets older code do.
--
-- Every migrator records, for the schema version it leaves, the oldest schema version
-- whose code may still run on this database (the newest breaking migration applied:
-- the additive ones after it only add what older code neither reads nor needs to
-- write) and the leasehold release that migrated it. A binary that finds a schema
-- newer than it knows reads the row of the newest version: it runs when its own
-- schema is at least `oldest_compatible`, and is refused naming `written_by`
-- otherwise (docs/upgrades.md).
--
-- The format is stable: older binaries read these rows without knowing the
-- migrations that came after them. `version`, `oldest_compatible` and `written_by`
-- keep their names, types and meaning in every later release; columns may be added,
-- never dropped, renamed or retyped.
CREATE TABLE schema_compat (
    version           BIGINT NOT NULL PRIMARY KEY,
    oldest_compatible BIGINT NOT NULL,
    written_by        TEXT COLLATE "C" NOT NULL,
    written_at        BIGINT NOT NULL
);
