-- Version 5: check results become state. A row is an interval in which one (node, check,
-- component) kept one state: `time` first seen, `last_seen` the latest run that still saw it,
-- `is_open` while it is the component's current state. Every existing row becomes a point
-- (last_seen = time, closed): no row is lost and every reader sees what it saw before.
-- Record ids are kept whole (up to 128 characters; they were cut to 32, which collapsed
-- distinct imported records), in check_results, node_actions and attributions.evidence.
-- New: node_runs (the latest heartbeat per node and entry point) and the daily rollups.

ALTER TABLE check_results ALTER COLUMN id TYPE VARCHAR(128);

ALTER TABLE check_results ADD COLUMN last_seen TIMESTAMP WITHOUT TIME ZONE;

UPDATE check_results SET last_seen = time;

ALTER TABLE check_results ALTER COLUMN last_seen SET NOT NULL;

ALTER TABLE check_results ADD COLUMN is_open BOOLEAN DEFAULT false NOT NULL;

ALTER TABLE check_results ALTER COLUMN is_open DROP DEFAULT;

CREATE INDEX ix_check_results_open ON check_results (node, "check") WHERE is_open;

ALTER TABLE node_actions ALTER COLUMN id TYPE VARCHAR(128);

ALTER TABLE attributions ALTER COLUMN evidence TYPE VARCHAR(128);

CREATE TABLE node_runs (
	node VARCHAR(128) NOT NULL,
	source VARCHAR(16) NOT NULL,
	last_seen TIMESTAMP WITHOUT TIME ZONE NOT NULL,
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
