-- Version 15: the node inventory says each node's GPU model when it knows it (`healthctl
-- ingest inventory`, an optional gpu_model column; '' unknown): the lemon rules judge a node
-- against the peers of its cluster/partition and GPU model, so a mixed fleet's models, whose
-- failure rates differ, are not one peer group. Rows written before keep '' (grouped as before).
-- No existing row is rewritten.

ALTER TABLE node_inventory ADD COLUMN gpu_model VARCHAR(64) DEFAULT '' NOT NULL;
