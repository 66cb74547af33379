-- Version 20: when each node's epilog ran for a job (the spool's job_end records, which the
-- flush used to drop). A job `ingest sacct` last read running has no end in `jobs` until the
-- next ingest (hourly); the fail-slow detector ends it on each node at that node's epilog, so
-- what the node did after it is not judged in it. A new table only: no existing row changes.
-- Keys compare as bytes, as jobs' do (0006). The nodes' role inserts into it:
-- deploy/postgresql/grants.sql grants it; run it after this upgrade, as after every one.

CREATE TABLE job_ends (
	node VARCHAR(128) COLLATE "C" NOT NULL,
	job_id VARCHAR(32) COLLATE "C" NOT NULL,
	time TIMESTAMP WITHOUT TIME ZONE NOT NULL,
	PRIMARY KEY (node, job_id, time)
);

CREATE INDEX ix_job_ends_time ON job_ends (time);
