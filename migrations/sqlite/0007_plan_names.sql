-- leasehold SQLite schema, version 7: plans found by name.
--
-- `history`, `gate`, the API and the console accept a plan's name where they accept
-- its id; without an index each such lookup read every plan.
CREATE INDEX plan_by_name ON plan (name);
