-- Version 5: check results become state. A row is an interval in which one (node, check,
-- component) kept one state: `time` first seen, `last_seen` the latest run that still saw it,
-- `is_open` while it is the component's current state. Every existing row becomes a point
-- (last_seen = time, closed): no row is lost and every reader sees what it saw before.
-- Record ids are kept whole (up to 128 characters; they were cut to 32, which collapsed
-- distinct imported records), in check_results, node_actions and attributions.evidence.
-- SQLite cannot change a column's type in place: copy, drop, rename, index again.
-- New: node_runs (the latest heartbeat per node and entry point) and the daily rollups.

CREATE TABLE check_results_v5 (
	id VARCHAR(128) NOT NULL,
	time DATETIME NOT NULL,
	node VARCHAR(128) NOT NULL,
	source VARCHAR(16) NOT NULL,
	job_id VARCHAR(32),
	"check" VARCHAR(32) NOT NULL,
	component VARCHAR(64) NOT NULL,
	status VARCHAR(8) NOT NULL,
	severity VARCHAR(16) NOT NULL,
	code VARCHAR(32) NOT NULL,
	reason TEXT NOT NULL,
	last_seen DATETIME NOT NULL,
	is_open BOOLEAN NOT NULL,
	PRIMARY KEY (id)
);

INSERT INTO check_results_v5 (id, time, node, source, job_id, "check", component, status, severity, code, reason, last_seen, is_open) SELECT id, time, node, source, job_id, "check", component, status, severity, code, reason, time, 0 FROM check_results;

DROP TABLE check_results;

ALTER TABLE check_results_v5 RENAME TO check_results;

CREATE INDEX ix_check_results_node_time ON check_results (node, time);

CREATE INDEX ix_check_results_time ON check_results (time);

CREATE INDEX ix_check_results_open ON check_results (node, "check") WHERE is_open;

CREATE TABLE node_actions_v5 (
	id VARCHAR(128) NOT NULL,
	time DATETIME NOT NULL,
	node VARCHAR(128) NOT NULL,
	action VARCHAR(24) NOT NULL,
	reason TEXT NOT NULL,
	job_id VARCHAR(32),
	PRIMARY KEY (id)
);

INSERT INTO node_actions_v5 (id, time, node, action, reason, job_id) SELECT id, time, node, action, reason, job_id FROM node_actions;

DROP TABLE node_actions;

ALTER TABLE node_actions_v5 RENAME TO node_actions;

CREATE INDEX ix_node_actions_node_time ON node_actions (node, time);

CREATE TABLE attributions_v5 (
	id INTEGER NOT NULL,
	job_pk INTEGER NOT NULL,
	node VARCHAR(128),
	cause VARCHAR(32) NOT NULL,
	code VARCHAR(32) NOT NULL,
	evidence VARCHAR(128) NOT NULL,
	kind VARCHAR(16) NOT NULL,
	PRIMARY KEY (id),
	FOREIGN KEY(job_pk) REFERENCES jobs (id) ON DELETE CASCADE
);

INSERT INTO attributions_v5 (id, job_pk, node, cause, code, evidence, kind) SELECT id, job_pk, node, cause, code, evidence, kind FROM attributions;

DROP TABLE attributions;

ALTER TABLE attributions_v5 RENAME TO attributions;

CREATE INDEX ix_attributions_job ON attributions (job_pk);

CREATE INDEX ix_attributions_node ON attributions (node);

CREATE TABLE node_runs (
	node VARCHAR(128) NOT NULL,
	source VARCHAR(16) NOT NULL,
	last_seen DATETIME NOT NULL,
	level VARCHAR(16) NOT NULL,
	checker_errors INTEGER NOT NULL,
	duration_s FLOAT,
	version VARCHAR(32) NOT NULL,
	PRIMARY KEY (node, source)
);

CREATE TABLE heartbeat_days (
	day DATE NOT NULL,
	node VARCHAR(128) NOT NULL,
	runs INTEGER NOT NULL,
	checker_error_runs INTEGER NOT NULL,
	drain_runs INTEGER NOT NULL,
	PRIMARY KEY (day, node)
);

CREATE TABLE check_days (
	day DATE NOT NULL,
	node VARCHAR(128) NOT NULL,
	"check" VARCHAR(32) NOT NULL,
	"fail" INTEGER NOT NULL,
	warn INTEGER NOT NULL,
	PRIMARY KEY (day, node, "check")
);
