"""A reservation made with a client generated from the committed openapi.json, as a client
team would make one (the core's test `openapi::a_client_generated_from_openapi_json_reserves`).

    python3 loadtest/client/reserve.py GENERATED_DIR BASE_URL ADMIN_TOKEN CODE

GENERATED_DIR holds the package `voucher_gate_client` made by
`openapi-python-client generate --path openapi.json --meta none`. Prints one JSON line of
what each call answered; exits 1 on an answer the document does not promise.
"""

import datetime
import json
import sys

sys.path.insert(0, sys.argv[1])
base, token, code = sys.argv[2], sys.argv[3], sys.argv[4]

from voucher_gate_client import AuthenticatedClient, Client  # noqa: E402
from voucher_gate_client.api.reservations import reserve  # noqa: E402
from voucher_gate_client.api.vouchers import create_voucher, get_voucher  # noqa: E402
from voucher_gate_client.models import (  # noqa: E402
    CreateVoucher,
    ErrorBody,
    Reserve,
    ReservationView,
    VoucherView,
)

now = datetime.datetime.now(datetime.timezone.utc)
admin = AuthenticatedClient(base_url=base, token=token)
made = create_voucher.sync_detailed(
    client=admin,
    body=CreateVoucher(
        code=code,
        discount_amount=5000,
        total_limit=1,
        starts_at=now - datetime.timedelta(hours=1),
        ends_at=now + datetime.timedelta(hours=1),
    ),
)
public = Client(base_url=base)
first = reserve.sync_detailed(code, client=public, body=Reserve(customer_id="42", order_id="gen-1", order_amount=250000))
again = reserve.sync_detailed(code, client=public, body=Reserve(customer_id="42", order_id="gen-1", order_amount=250000))
late = reserve.sync_detailed(code, client=public, body=Reserve(customer_id="43", order_id="gen-2", order_amount=250000))
voucher = get_voucher.sync(code, client=public)

out = {
    "created": int(made.status_code),
    "created_is_voucher": isinstance(made.parsed, VoucherView),
    "first": int(first.status_code),
    "first_discount": first.parsed.discount_amount if isinstance(first.parsed, ReservationView) else None,
    "again": int(again.status_code),
    "again_replayed": again.headers.get("idempotent-replayed"),
    "late": int(late.status_code),
    "late_error": late.parsed.error.value if isinstance(late.parsed, ErrorBody) else None,
    "used": voucher.used_count if isinstance(voucher, VoucherView) else None,
}
print(json.dumps(out))
