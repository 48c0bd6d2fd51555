-- leasehold SQLite schema, version 6: room for rows to grow into.
--
-- SQLite appends new rows in key order and packs them into full pages. A transition
-- then rewrites a row bigger than it was (a claim adds the lease, a finish adds the
-- evidence and its fingerprint), which no longer fits its full page: SQLite splits
-- and rebalances the page and its siblings, and ends such a transaction with a scan
-- of its whole page cache. Each of the three tables gets a `room` column of zero
-- bytes, never read: a row is written with as much room as its mutable columns will
-- usually need, and every transition shrinks the room by what they grew, so the row
-- keeps its size and is rewritten in place. Rows written before this version have no
-- room (NULL) and grow as before.
ALTER TABLE attempt ADD COLUMN room BLOB;
ALTER TABLE command ADD COLUMN room BLOB;
ALTER TABLE receipt ADD COLUMN room BLOB;
