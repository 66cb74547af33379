-- Version 6: the keys of jobs and job_nodes are compared as bytes (COLLATE "C"), as SQLite
-- compares all text. Equality, and so every lookup and join, is unchanged; only the order of
-- these columns in ORDER BY follows bytes instead of the database's locale. Sorting them into
-- indexes (a first backfill, each migration, REINDEX) costs about half as much.
-- No row is rewritten: PostgreSQL keeps the table and rebuilds the indexes on these columns
-- (about a minute for a year of a large cluster's accounting, under an exclusive lock).

ALTER TABLE jobs ALTER COLUMN job_id TYPE VARCHAR(32) COLLATE "C";

ALTER TABLE jobs ALTER COLUMN instance_key TYPE VARCHAR(96) COLLATE "C";

ALTER TABLE job_nodes ALTER COLUMN node TYPE VARCHAR(128) COLLATE "C";
