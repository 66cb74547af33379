-- Version 2: job_nodes becomes a WITHOUT ROWID table. Its primary key (job_pk, node) is the
-- whole row, so a rowid table stored every row twice (the table and the key's index); the
-- clustered table stores it once, about a tenth less file and a faster sacct ingest.
-- SQLite cannot change this in place: copy, drop, rename, index again, in one transaction.
-- job_nodes is only a child table (nothing references it), so dropping it fires no
-- foreign-key action.

CREATE TABLE job_nodes_v2 (
	job_pk INTEGER NOT NULL,
	node VARCHAR(128) NOT NULL,
	PRIMARY KEY (job_pk, node),
	FOREIGN KEY(job_pk) REFERENCES jobs (id) ON DELETE CASCADE
) WITHOUT ROWID;

INSERT INTO job_nodes_v2 (job_pk, node) SELECT job_pk, node FROM job_nodes ORDER BY job_pk, node;

DROP TABLE job_nodes;

ALTER TABLE job_nodes_v2 RENAME TO job_nodes;

CREATE INDEX ix_job_nodes_node ON job_nodes (node);
