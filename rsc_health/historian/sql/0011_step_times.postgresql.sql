-- Version 11: step times jobs report, the slowest rank per node and step
-- (rsc_health/historian/ingest/steps.py, docs/failslow.md). A new table only: no existing
-- row changes. (9 and 10 are reserved for the telemetry and suspect-tier migrations.) Keys compare as bytes, as jobs' do (0006).

CREATE TABLE step_times (
	job_id VARCHAR(32) COLLATE "C" NOT NULL,
	node VARCHAR(128) COLLATE "C" NOT NULL,
	stage VARCHAR(64) COLLATE "C" NOT NULL,
	step BIGINT NOT NULL,
	rank INTEGER NOT NULL,
	time TIMESTAMP WITHOUT TIME ZONE NOT NULL,
	seconds FLOAT NOT NULL,
	unit VARCHAR(8) NOT NULL,
	PRIMARY KEY (job_id, node, stage, step)
);

CREATE INDEX ix_step_times_time ON step_times (time);
