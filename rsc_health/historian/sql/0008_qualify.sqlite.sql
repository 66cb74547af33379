-- Version 8: qualification runs and their per-metric results, judged against peers
-- (rsc_health/qualify). New tables only: no existing row changes.

CREATE TABLE qualify_runs (
	run_id VARCHAR(128) NOT NULL,
	node VARCHAR(128) NOT NULL,
	tier VARCHAR(16) NOT NULL,
	started DATETIME NOT NULL,
	ended DATETIME NOT NULL,
	verdict VARCHAR(16) NOT NULL,
	reason TEXT NOT NULL,
	gpu_model VARCHAR(64) NOT NULL,
	driver VARCHAR(32) NOT NULL,
	job_id VARCHAR(32),
	PRIMARY KEY (run_id)
);

CREATE INDEX ix_qualify_runs_node_ended ON qualify_runs (node, ended);

CREATE TABLE qualify_results (
	run_id VARCHAR(128) NOT NULL,
	test VARCHAR(32) NOT NULL,
	metric VARCHAR(128) NOT NULL,
	idx VARCHAR(32) NOT NULL,
	value FLOAT,
	unit VARCHAR(16) NOT NULL,
	higher_is_better BOOLEAN NOT NULL,
	status VARCHAR(16) NOT NULL,
	reason TEXT NOT NULL,
	basis VARCHAR(16) NOT NULL,
	peer_median FLOAT,
	threshold FLOAT,
	percentile FLOAT,
	peers INTEGER NOT NULL,
	PRIMARY KEY (run_id, test, metric, idx),
	FOREIGN KEY(run_id) REFERENCES qualify_runs (run_id) ON DELETE CASCADE
);

CREATE INDEX ix_qualify_results_metric ON qualify_results (metric, idx, status);
