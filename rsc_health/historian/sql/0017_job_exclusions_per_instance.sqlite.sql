-- Version 17: a job's exclusions are keyed by the job instance, (job_id, node, time), `time`
-- being when the job's prolog recorded them (its start). Slurm reuses job ids (a fresh
-- StateSaveLocation starts again at FirstJobId; MaxJobId wraps), and under the old key
-- (job_id, node) a new job with a reused id that excluded the same node was dropped as the
-- old one's row: its exclusion never counted. A record delivered twice keeps its time, so it
-- still lands once. Every row is kept (unique on (job_id, node), so on the new key too).
-- SQLite cannot change a primary key in place: copy, drop, rename, index again, in one
-- transaction (nothing references job_exclusions).

CREATE TABLE job_exclusions_v17 (
	job_id VARCHAR(32) NOT NULL,
	node VARCHAR(128) NOT NULL,
	time DATETIME NOT NULL,
	PRIMARY KEY (job_id, node, time)
);

INSERT INTO job_exclusions_v17 (job_id, node, time) SELECT job_id, node, time FROM job_exclusions;

DROP TABLE job_exclusions;

ALTER TABLE job_exclusions_v17 RENAME TO job_exclusions;

CREATE INDEX ix_job_exclusions_node_time ON job_exclusions (node, time);
