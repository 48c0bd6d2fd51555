-- leasehold SQLite schema, version 2: indexes that hold only what a claim can take.
--
-- Version 1 indexed every command by (status, available_at) and (status, lease_until),
-- and every attempt by status. A claim then moved four command index entries and two
-- attempt index entries, and a finished delivery kept its entries forever. Partial
-- indexes hold only the rows a claim searches: PENDING commands by availability and
-- PROCESSING commands by lease deadline. A claim moves one entry from the first to the
-- second; finishing removes it; terminal commands are in neither.
--
-- open_attempts counts QUEUED and RUNNING attempts. Every transition keeps an attempt
-- and its command in step (QUEUED with PENDING, RUNNING with PROCESSING), so it counts
-- PENDING and PROCESSING commands in these two indexes instead of keeping an index of
-- attempts by status.

DROP INDEX attempt_by_status;
DROP INDEX command_claimable;
DROP INDEX command_expired;

-- Claims: PENDING commands whose available_at has passed, oldest first, then by id.
CREATE INDEX command_pending ON command (available_at, id) WHERE status = 'PENDING';
-- Takeovers and reconcile: PROCESSING commands whose lease_until has passed.
CREATE INDEX command_leased ON command (lease_until) WHERE status = 'PROCESSING';
