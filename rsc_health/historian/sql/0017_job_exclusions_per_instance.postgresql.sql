-- Version 17: a job's exclusions are keyed by the job instance, (job_id, node, time), `time`
-- being when the job's prolog recorded them (its start). Slurm reuses job ids (a fresh
-- StateSaveLocation starts again at FirstJobId; MaxJobId wraps), and under the old key
-- (job_id, node) a new job with a reused id that excluded the same node was dropped as the
-- old one's row: its exclusion never counted. A record delivered twice keeps its time, so it
-- still lands once. Every row is kept (unique on (job_id, node), so on the new key too).
-- The nodes' role needs SELECT on `time` now (the ON CONFLICT target):
-- deploy/postgresql/grants.sql grants it; run it after this upgrade, as after every one.

ALTER TABLE job_exclusions DROP CONSTRAINT job_exclusions_pkey;

ALTER TABLE job_exclusions ADD CONSTRAINT job_exclusions_pkey PRIMARY KEY (job_id, node, time);
