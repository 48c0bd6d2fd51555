-- leasehold SQLite schema, version 5: the open attempts, indexed.
--
-- An attempt is open while it is QUEUED or RUNNING (the engine's enqueue guard reads
-- the attempt's own status). Every SQL ledger counts open attempts by that status;
-- this partial index holds only the open ones, so the count reads as many entries as
-- there are open attempts, never the finished ones. An attempt enters it at enqueue
-- and leaves it when it finishes, fails or is aborted.
CREATE INDEX attempt_open ON attempt (status) WHERE status IN ('QUEUED', 'RUNNING');
