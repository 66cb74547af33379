-- Version 10: suspect nodes (rsc_health/suspects.py): one row per episode, renewed by
-- fail-slow evidence, ended cleared, confirmed or expired. A new table only: no row changes.
-- Safe to run again (IF NOT EXISTS): main reached version 12 before 0010 was merged, and a
-- historian already at 12 skips it; applying this file to it by hand is harmless.

CREATE TABLE IF NOT EXISTS suspects (
	id INTEGER NOT NULL,
	node VARCHAR(128) NOT NULL,
	state VARCHAR(16) NOT NULL,
	since DATETIME NOT NULL,
	last_evidence DATETIME NOT NULL,
	expires DATETIME NOT NULL,
	metric VARCHAR(64) NOT NULL,
	value FLOAT,
	peer_median FLOAT,
	deviation FLOAT,
	job_ids TEXT NOT NULL,
	source VARCHAR(16) NOT NULL,
	detail TEXT NOT NULL,
	changed DATETIME NOT NULL,
	changed_by VARCHAR(64) NOT NULL,
	change_reason TEXT NOT NULL,
	tier VARCHAR(16) NOT NULL,
	slurm_weight INTEGER,
	PRIMARY KEY (id)
);

CREATE INDEX IF NOT EXISTS ix_suspects_node_state ON suspects (node, state);

CREATE INDEX IF NOT EXISTS ix_suspects_state ON suspects (state);

-- At most one open episode per node, whatever two passes at once do.
CREATE UNIQUE INDEX IF NOT EXISTS ux_suspects_open ON suspects (node) WHERE state = 'suspect';
