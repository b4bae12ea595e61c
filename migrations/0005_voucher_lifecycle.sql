-- A voucher's lifecycle and the audit trail of every admin change.
--
-- `state` is what an operator set: `active`, `paused` (the kill switch: new reservations
-- are refused, holders keep theirs) or `archived` (for good, only without an active
-- reservation). Where the sale window puts the voucher (scheduled, live, ended) is read
-- from the window, never stored. Every statement that takes a use reads `state` from the
-- voucher's row as it locks it, so a pause committed is a pause in force.
--
-- `version` grows by one with every change of the row's definition or state: the `ETag`
-- a change must name (`If-Match`), and what a flash gate compares to know it has the
-- latest definition.
ALTER TABLE vouchers
    ADD COLUMN state      TEXT        NOT NULL DEFAULT 'active',
    ADD COLUMN version    BIGINT      NOT NULL DEFAULT 1,
    ADD COLUMN updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    ADD CONSTRAINT vouchers_state_known CHECK (state IN ('active', 'paused', 'archived')),
    ADD CONSTRAINT vouchers_version_positive CHECK (version > 0);

-- `GET /vouchers` pages through codes in byte order.
CREATE INDEX vouchers_by_code_c ON vouchers (code COLLATE "C");

-- One row per admin change, written in the transaction of the change itself: a change
-- without its row, or a row without its change, cannot be committed.
CREATE TABLE audit_events (
    id            BIGINT       GENERATED ALWAYS AS IDENTITY,
    at            TIMESTAMPTZ  NOT NULL DEFAULT now(),
    -- The name of the credential that made the change.
    actor         TEXT         NOT NULL,
    -- create, change, pause, resume, archive, reload_gate
    action        TEXT         NOT NULL,
    voucher_code  VARCHAR(32)  NOT NULL,
    -- The voucher as it was and as it became (null before a creation).
    before        JSONB,
    after         JSONB,
    request_id    TEXT,

    CONSTRAINT audit_events_pkey PRIMARY KEY (id),
    CONSTRAINT audit_events_voucher_fkey FOREIGN KEY (voucher_code) REFERENCES vouchers (code)
);
CREATE INDEX audit_events_by_voucher ON audit_events (voucher_code, id);
