-- Vouchers and the uses taken from them.
--
-- PostgreSQL is the source of truth about money. The constraints below are the last
-- guard: whatever the layers above do (a bug, a Redis gate loaded with a wrong number),
-- the database refuses to hold more uses than a voucher allows. Constraint names are
-- stable because the service maps violations to client errors by name.

CREATE TABLE vouchers (
    code             VARCHAR(32)  NOT NULL,
    discount_amount  BIGINT       NOT NULL,
    min_order_amount BIGINT       NOT NULL DEFAULT 0,
    total_limit      INTEGER      NOT NULL,
    -- Uses currently held (RESERVED or CONFIRMED). Kept in step with the rows of
    -- `redemptions` by the same transaction that changes them.
    used_count       INTEGER      NOT NULL DEFAULT 0,
    per_user_limit   INTEGER      NOT NULL DEFAULT 1,
    starts_at        TIMESTAMPTZ  NOT NULL,
    ends_at          TIMESTAMPTZ  NOT NULL,
    mode             TEXT         NOT NULL DEFAULT 'standard',
    created_at       TIMESTAMPTZ  NOT NULL DEFAULT now(),

    CONSTRAINT vouchers_pkey PRIMARY KEY (code),
    CONSTRAINT vouchers_used_within_limit CHECK (used_count <= total_limit),
    CONSTRAINT vouchers_used_not_negative CHECK (used_count >= 0),
    CONSTRAINT vouchers_total_limit_positive CHECK (total_limit > 0),
    CONSTRAINT vouchers_per_user_limit_positive CHECK (per_user_limit > 0),
    CONSTRAINT vouchers_discount_positive CHECK (discount_amount > 0),
    CONSTRAINT vouchers_min_order_not_negative CHECK (min_order_amount >= 0),
    CONSTRAINT vouchers_window_ordered CHECK (starts_at < ends_at),
    CONSTRAINT vouchers_mode_known CHECK (mode IN ('standard', 'flash'))
);

CREATE TABLE redemptions (
    id               BIGINT       GENERATED ALWAYS AS IDENTITY,
    voucher_code     VARCHAR(32)  NOT NULL,
    customer_id      VARCHAR(64)  NOT NULL,
    -- Made by the caller; the idempotency key of a reservation.
    order_id         VARCHAR(64)  NOT NULL,
    order_amount     BIGINT       NOT NULL,
    -- What this order is granted: the voucher's discount, never more than the order.
    discount_amount  BIGINT       NOT NULL,
    status           TEXT         NOT NULL DEFAULT 'RESERVED',
    reserved_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    expires_at       TIMESTAMPTZ  NOT NULL,
    confirmed_at     TIMESTAMPTZ,
    released_at      TIMESTAMPTZ,

    CONSTRAINT redemptions_pkey PRIMARY KEY (id),
    CONSTRAINT redemptions_voucher_fkey FOREIGN KEY (voucher_code) REFERENCES vouchers (code),
    -- One orderId holds at most one use, across all vouchers.
    CONSTRAINT redemptions_order_id_key UNIQUE (order_id),
    CONSTRAINT redemptions_status_known CHECK (status IN ('RESERVED', 'CONFIRMED', 'RELEASED')),
    CONSTRAINT redemptions_amounts_valid CHECK (order_amount > 0 AND discount_amount > 0
                                                AND discount_amount <= order_amount),
    CONSTRAINT redemptions_confirmed_at_set CHECK ((status = 'CONFIRMED') = (confirmed_at IS NOT NULL)),
    CONSTRAINT redemptions_released_at_set CHECK ((status = 'RELEASED') = (released_at IS NOT NULL))
);

-- The expiry job scans only the reservations still open.
CREATE INDEX redemptions_open_by_expiry ON redemptions (expires_at) WHERE status = 'RESERVED';
-- Counts per voucher (GET /vouchers/{code}, invariant checks).
CREATE INDEX redemptions_by_voucher_status ON redemptions (voucher_code, status);

-- Uses currently held per customer and voucher. A conditional upsert on this row is what
-- enforces per_user_limit for any N without a race: the row lock serialises two orders of
-- the same customer, and the conditional increment refuses the one past the limit.
-- `per_user_limit` is copied from the voucher (which never changes it) so that a CHECK can
-- hold the limit here too, as the last guard.
CREATE TABLE customer_usage (
    voucher_code     VARCHAR(32)  NOT NULL,
    customer_id      VARCHAR(64)  NOT NULL,
    active_count     INTEGER      NOT NULL,
    per_user_limit   INTEGER      NOT NULL,

    CONSTRAINT customer_usage_pkey PRIMARY KEY (voucher_code, customer_id),
    CONSTRAINT customer_usage_voucher_fkey FOREIGN KEY (voucher_code) REFERENCES vouchers (code),
    CONSTRAINT customer_usage_within_limit CHECK (active_count <= per_user_limit),
    CONSTRAINT customer_usage_not_negative CHECK (active_count >= 0)
);
