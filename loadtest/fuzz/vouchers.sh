#!/usr/bin/env bash
# Creates the vouchers the fuzz run aims at, on the core at $1 with admin token $2:
# FUZZSTD (standard, many uses), FUZZFLASH (flash, many uses), FUZZGONE (flash, 1 use, sold
# out at once). A voucher that exists already (409) is kept.
set -euo pipefail
core=$1 token=$2
now=$(date -u -d '-1 minute' +%FT%TZ); end=$(date -u -d '+1 day' +%FT%TZ)
for spec in FUZZSTD:standard:1000000 FUZZFLASH:flash:1000000 FUZZGONE:flash:1; do
  IFS=: read -r code mode uses <<<"$spec"
  status=$(curl -sS -o /dev/null -w '%{http_code}' -X POST "$core/vouchers" \
    -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    -d "{\"code\":\"$code\",\"discountAmount\":1000,\"minOrderAmount\":0,\"totalLimit\":$uses,\"perUserLimit\":$uses,\"startsAt\":\"$now\",\"endsAt\":\"$end\",\"mode\":\"$mode\"}")
  [[ $status == 201 || $status == 409 ]] || { echo "creating $code: HTTP $status" >&2; exit 1; }
done
# Sell FUZZGONE out, so the edge holds a sold-out flag for it during the run.
curl -sS -o /dev/null -X POST "$core/vouchers/FUZZGONE/reservations" -H 'Content-Type: application/json' \
  -d '{"customerId":"fuzz-first","orderId":"fuzz-gone-1","orderAmount":100000}'
