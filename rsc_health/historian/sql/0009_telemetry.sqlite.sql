-- Version 9: telemetry (issue 25). The node-level samples each sweep spools (one row per
-- time, node and metric of model.Metric), kept [historian] telemetry_retention_days, and their
-- rollups per node and multi-node job and per node-day outside such jobs, kept as the other
-- daily rollups. New tables only: no existing row changes.

CREATE TABLE telemetry_samples (
	time DATETIME NOT NULL,
	node VARCHAR(128) NOT NULL,
	metric VARCHAR(32) NOT NULL,
	value FLOAT NOT NULL,
	component VARCHAR(64) NOT NULL,
	PRIMARY KEY (time, node, metric)
) WITHOUT ROWID;

CREATE TABLE telemetry_job_rollups (
	job_pk INTEGER NOT NULL,
	node VARCHAR(128) NOT NULL,
	metric VARCHAR(32) NOT NULL,
	n INTEGER NOT NULL,
	mean FLOAT NOT NULL,
	min FLOAT NOT NULL,
	max FLOAT NOT NULL,
	past INTEGER NOT NULL,
	worst_component VARCHAR(64) NOT NULL,
	PRIMARY KEY (job_pk, node, metric),
	FOREIGN KEY(job_pk) REFERENCES jobs (id) ON DELETE CASCADE
) WITHOUT ROWID;

CREATE TABLE telemetry_day_rollups (
	day DATE NOT NULL,
	node VARCHAR(128) NOT NULL,
	metric VARCHAR(32) NOT NULL,
	n INTEGER NOT NULL,
	mean FLOAT NOT NULL,
	min FLOAT NOT NULL,
	max FLOAT NOT NULL,
	past INTEGER NOT NULL,
	worst_component VARCHAR(64) NOT NULL,
	PRIMARY KEY (day, node, metric)
) WITHOUT ROWID;
