-- Version 21: when each node's prolog ran for a job of two or more nodes (the spool's
-- job_start records that name the job's nodes; the flush kept only their exclusions). Until
-- the next `ingest sacct` (hourly) tells of a job, the fail-slow detector takes it as running
-- on each node whose prolog told, once all the nodes it names have. A new table only: no
-- existing row changes. Keys compare as bytes, as jobs' do (0006). The nodes' role inserts
-- into it: deploy/postgresql/grants.sql grants it; run it after this upgrade, as after every
-- one.

CREATE TABLE job_starts (
	node VARCHAR(128) COLLATE "C" NOT NULL,
	job_id VARCHAR(32) COLLATE "C" NOT NULL,
	time TIMESTAMP WITHOUT TIME ZONE NOT NULL,
	nnodes INTEGER NOT NULL,
	nodes_digest VARCHAR(16) NOT NULL,
	PRIMARY KEY (node, job_id, time)
);

CREATE INDEX ix_job_starts_time ON job_starts (time);
