-- leasehold PostgreSQL schema, version 3: open attempts counted by their commands.
--
-- An attempt is QUEUED exactly while its command is PENDING, and RUNNING exactly
-- while its command is PROCESSING: every transition writes the two together.
-- `open_attempts` already counts the commands in the claims' partial indexes
-- (`command_pending`, `command_leased`); the console's QUEUED and RUNNING counts now
-- read them too. `attempt_open` (version 1) had to follow every claim (its QUEUED
-- entry out, a RUNNING one in) and every finish (out), and nothing reads it any more.
DROP INDEX IF EXISTS attempt_open;
