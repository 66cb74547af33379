-- Version 7: the node inventory. Each node's in-service intervals with its cluster and
-- partition, imported (`healthctl ingest inventory`), so exposure (node-days per peer group)
-- and the fleet's own failure rate can be computed from event history. No existing row changes.

CREATE TABLE node_inventory (
	id SERIAL NOT NULL,
	node VARCHAR(128) NOT NULL,
	cluster VARCHAR(64) NOT NULL,
	partition VARCHAR(64) NOT NULL,
	start TIMESTAMP WITHOUT TIME ZONE NOT NULL,
	"end" TIMESTAMP WITHOUT TIME ZONE,
	source VARCHAR(16) NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_node_inventory UNIQUE (node, start)
);
