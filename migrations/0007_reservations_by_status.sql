-- A voucher's reservations by status, page after page in the order they were taken
-- (`GET /vouchers/{code}/reservations`, the CSV export): a keyset on `id` within one
-- voucher and status, so a page costs the same however deep into a million rows it is.
CREATE INDEX redemptions_by_voucher_status_id ON redemptions (voucher_code, status, id);
