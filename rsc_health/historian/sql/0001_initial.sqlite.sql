-- Generated from rsc_health/historian/schema.py for sqlite.

CREATE TABLE check_results (
	id VARCHAR(32) NOT NULL,
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
	PRIMARY KEY (id)
);

CREATE INDEX ix_check_results_node_time ON check_results (node, time);

CREATE INDEX ix_check_results_time ON check_results (time);

CREATE TABLE ingest_cursors (
	name VARCHAR(64) NOT NULL,
	value TEXT NOT NULL,
	PRIMARY KEY (name)
);

CREATE TABLE job_exclusions (
	job_id VARCHAR(32) NOT NULL,
	node VARCHAR(128) NOT NULL,
	time DATETIME NOT NULL,
	PRIMARY KEY (job_id, node)
);

CREATE INDEX ix_job_exclusions_node_time ON job_exclusions (node, time);

CREATE TABLE jobs (
	id INTEGER NOT NULL,
	job_id VARCHAR(32) NOT NULL,
	job_id_display VARCHAR(64) NOT NULL,
	name TEXT NOT NULL,
	user VARCHAR(64) NOT NULL,
	partition VARCHAR(64) NOT NULL,
	state VARCHAR(24) NOT NULL,
	exit_code VARCHAR(16) NOT NULL,
	submit DATETIME NOT NULL,
	eligible DATETIME,
	start DATETIME,
	"end" DATETIME,
	nnodes INTEGER NOT NULL,
	gpus INTEGER NOT NULL,
	nodelist TEXT NOT NULL,
	instance_key VARCHAR(96) NOT NULL,
	PRIMARY KEY (id),
	UNIQUE (instance_key)
);

CREATE INDEX ix_jobs_end ON jobs ("end");

CREATE INDEX ix_jobs_job_id ON jobs (job_id);

CREATE TABLE node_actions (
	id VARCHAR(32) NOT NULL,
	time DATETIME NOT NULL,
	node VARCHAR(128) NOT NULL,
	action VARCHAR(24) NOT NULL,
	reason TEXT NOT NULL,
	job_id VARCHAR(32),
	PRIMARY KEY (id)
);

CREATE INDEX ix_node_actions_node_time ON node_actions (node, time);

CREATE TABLE node_events (
	id INTEGER NOT NULL,
	node VARCHAR(128) NOT NULL,
	start DATETIME NOT NULL,
	"end" DATETIME,
	state VARCHAR(32) NOT NULL,
	reason TEXT NOT NULL,
	source VARCHAR(16) NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_node_events UNIQUE (node, start, state)
);

CREATE INDEX ix_node_events_node_start ON node_events (node, start);

CREATE TABLE schema_version (
	version INTEGER NOT NULL,
	PRIMARY KEY (version)
);

CREATE TABLE tickets (
	id INTEGER NOT NULL,
	node VARCHAR(128) NOT NULL,
	opened DATETIME NOT NULL,
	closed DATETIME,
	reason TEXT NOT NULL,
	source VARCHAR(16) NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_tickets_node_opened UNIQUE (node, opened)
);

CREATE TABLE attributions (
	id INTEGER NOT NULL,
	job_pk INTEGER NOT NULL,
	node VARCHAR(128),
	cause VARCHAR(32) NOT NULL,
	code VARCHAR(32) NOT NULL,
	evidence VARCHAR(64) NOT NULL,
	kind VARCHAR(16) NOT NULL,
	PRIMARY KEY (id),
	FOREIGN KEY(job_pk) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_attributions_job ON attributions (job_pk);

CREATE INDEX ix_attributions_node ON attributions (node);

CREATE TABLE job_nodes (
	job_pk INTEGER NOT NULL,
	node VARCHAR(128) NOT NULL,
	PRIMARY KEY (job_pk, node),
	FOREIGN KEY(job_pk) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_job_nodes_node ON job_nodes (node);
