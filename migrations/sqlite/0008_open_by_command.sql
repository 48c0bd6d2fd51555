-- leasehold SQLite schema, version 8: open attempts counted by their commands.
--
-- An attempt is open (QUEUED or RUNNING) exactly while its command is PENDING or
-- PROCESSING: every transition writes the two together. `open_attempts` now counts
-- the commands in the claims' partial indexes (`command_pending`, `command_leased`),
-- which every delivery maintains anyway. `attempt_open` (version 5) had to follow
-- each claim (QUEUED out, RUNNING in) and each finish (RUNNING out): about a fifth
-- of the pages a one-step delivery's commit wrote to the WAL.
DROP INDEX IF EXISTS attempt_open;
