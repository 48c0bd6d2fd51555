-- leasehold SQLite schema, version 17: each plan's step targets.
--
-- `plan.targets_json` holds the target of each of the plan's steps, in step order, as
-- a JSON array of strings: what routing and target limits read for the step (an
-- `http:v1` step's `scheme://host:port`, else its `target` or its executor). The
-- ledger writes it at registration. The server databases' `leasehold_enqueue` routine
-- reads it there instead of parsing URLs in SQL; SQLite has no such routine and
-- keeps the column so that every backend's schema has the same columns. NULL on a
-- plan registered before this version: registering the same plan again fills it.
ALTER TABLE plan ADD COLUMN targets_json TEXT;
