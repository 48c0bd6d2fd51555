-- leasehold SQLite schema, version 9: a plan's delivery policy.
--
-- `retry_json` holds the plan's `[retry]` table (canonical JSON, the clamped values
-- it was registered with), or NULL for a plan that sets none: such a plan is ruled
-- by the defaults. A step's own policy travels inside `steps_json`.
ALTER TABLE plan ADD COLUMN retry_json TEXT;
