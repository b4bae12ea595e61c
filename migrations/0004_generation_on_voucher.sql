-- The gate generation moves onto the voucher's own row.
--
-- Every grouped write of uses updates `vouchers.used_count`, so it holds that row's lock
-- anyway. Reading the generation from the row it locks (`FOR NO KEY UPDATE`, which hands
-- back the row's latest version) fences the write without a second row: the share lock
-- every batch took on `gate_generations` cost a WAL record per batch, and a MultiXact
-- whenever two batches overlapped. A load takes the next generation by updating this row,
-- which waits for every write in flight.
ALTER TABLE vouchers ADD COLUMN gate_generation BIGINT NOT NULL DEFAULT 0;

UPDATE vouchers v SET gate_generation = g.generation
FROM gate_generations g WHERE g.voucher_code = v.code;

DROP TABLE gate_generations;
