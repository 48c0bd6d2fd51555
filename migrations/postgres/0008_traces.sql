-- leasehold PostgreSQL schema, version 8: each attempt's trace context.
--
-- `traceparent` is the W3C trace context of the attempt (version 00, 55 characters):
-- the trace it was enqueued under and the enqueue's span. Its deliveries' spans are
-- children of it, and every http:v1 request carries it onward. NULL on attempts
-- enqueued before this version (and by a release older than it): they are delivered
-- as before, in a trace of their own.
ALTER TABLE attempt ADD COLUMN traceparent TEXT COLLATE "C";
