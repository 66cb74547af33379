-- Version 7: the node and GPU inventories. Each node's in-service intervals with its cluster
-- and partition, imported (`healthctl ingest inventory`), so exposure (node-days per peer
-- group) and the fleet's own failure rate can be computed from event history; each GPU's
-- intervals by serial and node (`healthctl ingest gpus`), so failures follow the GPU when it
-- moves. No existing row changes.

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

CREATE TABLE gpu_inventory (
	id SERIAL NOT NULL,
	serial VARCHAR(64) NOT NULL,
	node VARCHAR(128) NOT NULL,
	slot VARCHAR(32) NOT NULL,
	start TIMESTAMP WITHOUT TIME ZONE NOT NULL,
	"end" TIMESTAMP WITHOUT TIME ZONE,
	source VARCHAR(16) NOT NULL,
	PRIMARY KEY (id),
	CONSTRAINT uq_gpu_inventory UNIQUE (serial, start)
);

CREATE INDEX ix_gpu_inventory_node ON gpu_inventory (node, start);
