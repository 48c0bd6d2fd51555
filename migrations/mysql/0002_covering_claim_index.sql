-- leasehold MySQL / MariaDB schema, version 2: the claim index covers the claim window.
--
-- A claim reads a window of the oldest claimable commands — id, attempt_id and
-- available_at of PENDING commands in (available_at, id) order — before it locks any
-- of them. With command_claimable on (status, available_at) alone, every row of that
-- window cost a primary-key lookup for its attempt_id; on (status, available_at, id,
-- attempt_id) the window is read from the index alone, in its order (InnoDB keeps the
-- primary key id in every secondary index anyway: naming it fixes its place before
-- attempt_id). The index keeps its name, so that statements naming it (FORCE INDEX)
-- work on either version.
--
-- One statement, so that it is applied whole or not at all; running it again (a run
-- cut short after the ALTER but before its version was recorded) rebuilds the same
-- index.
ALTER TABLE command
    DROP INDEX command_claimable,
    ADD INDEX command_claimable (status, available_at, id, attempt_id);
