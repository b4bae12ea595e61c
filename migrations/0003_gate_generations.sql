-- Fencing of flash gate loads, and the indexes that let reconciliation look only at what
-- changed instead of reading every order of a voucher each round.
--
-- A gate is (re)loaded from a PostgreSQL read; the read takes the voucher's next
-- generation in the same transaction, under this row's lock, so a later generation always
-- comes from a later read. The gate opens only if its generation is still the voucher's
-- latest once its keys are filled, and only if Redis still holds that generation's
-- loading marker: a slow load of an older read can never overwrite a newer one.
CREATE TABLE gate_generations (
    voucher_code  VARCHAR(32)  NOT NULL,
    generation    BIGINT       NOT NULL,

    CONSTRAINT gate_generations_pkey PRIMARY KEY (voucher_code),
    CONSTRAINT gate_generations_voucher_fkey FOREIGN KEY (voucher_code) REFERENCES vouchers (code)
);

-- Counts per voucher and status as before, and "active rows reserved after the gate's
-- snapshot" as a range: reconciliation compares the gate with the voucher's counter minus
-- those, never with every row.
DROP INDEX redemptions_by_voucher_status;
CREATE INDEX redemptions_by_voucher_status ON redemptions (voucher_code, status, reserved_at);
-- Rows released since the last reconciliation round (their gate record may still hold).
CREATE INDEX redemptions_released_by_voucher ON redemptions (voucher_code, released_at)
    WHERE status = 'RELEASED';
