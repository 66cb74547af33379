-- Version 18: a job instance's key may name its cluster. Two clusters in one historian
-- number their jobs apart, and two set up together can give the same JobIDRaw to jobs
-- submitted and started in the same seconds: the key JobIDRaw:Submit:Start was then one
-- row for both (the second cluster's job updated the first's, or was lost in it). The
-- ingest now keys such a job <JobIDRaw>:<Submit>:<Start>@<cluster> (sacct.own_keys): up to
-- 72 + 1 + 64 characters. Only the length changes: VARCHAR(96) to VARCHAR(160) is not a
-- rewrite of the table nor of its unique index (a longer limit of the same type).

ALTER TABLE jobs ALTER COLUMN instance_key TYPE VARCHAR(160) COLLATE "C";
