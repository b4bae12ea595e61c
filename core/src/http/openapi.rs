//! The served OpenAPI document: what utoipa generates from the route table, completed with
//! what a client needs that is the same on every operation and so is written once here,
//! not on forty response lines:
//!
//! - `error` is an enum of every [`ErrorCode`];
//! - the response headers: `x-request-id` on every answer, `x-error-code` (the body's code)
//!   on every error, `Retry-After` on every 503 and 429, `Idempotent-Replayed` on the
//!   reservation's 201, `x-served-by: edge` on the edge's own answers;
//! - the edge's own answers, which reach clients of the public listener without a core
//!   having seen the request: 400 `BAD_REQUEST` (a request it could not read), 413, 429
//!   `RATE_LIMITED`, 431 `HEADERS_TOO_LARGE`, 503 (no core answered, or `OVERLOADED` at
//!   its admission limit), and 403 on the admin calls it refuses;
//! - an example body on every response.
//!
//! Schemathesis checks the service against this document (status codes, headers, content
//! types and bodies), in the tests and in `./loadtest/fuzz.sh`.

use serde_json::{json, Map, Value};
use utoipa::openapi::OpenApi as OpenApiDoc;
use voucher_contract::request::{IdRule, CUSTOMER_ID, ORDER_ID, REQUEST_ID, VOUCHER_CODE};
use voucher_contract::{headers, ErrorCode};

const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

/// Answers the edge gives itself on any forwarded operation: (status, description).
const EDGE_ANSWERS: [(&str, &str); 5] = [
    (
        "400",
        "BAD_REQUEST (edge): the request could not be read, or its body did not arrive within the edge's client_timeout",
    ),
    (
        "413",
        "PAYLOAD_TOO_LARGE (edge): a body over the edge's max_body_bytes",
    ),
    (
        "429",
        "RATE_LIMITED (edge, when rate limits are configured), with Retry-After",
    ),
    (
        "431",
        "HEADERS_TOO_LARGE (edge): request line and headers over the edge's max_header_bytes",
    ),
    (
        "503",
        "SERVICE_UNAVAILABLE (edge): no core answered; or OVERLOADED (edge, reservations): at its admission limit. With Retry-After",
    ),
];

/// The document as served.
pub fn complete(doc: &OpenApiDoc) -> Value {
    let mut doc = serde_json::to_value(doc).unwrap_or_else(|_| json!({}));
    let codes: Vec<Value> = ErrorCode::ALL.iter().map(|c| json!(c.as_str())).collect();
    doc["components"]["schemas"]["ErrorBody"]["properties"]["error"]["enum"] =
        Value::Array(codes.clone());
    doc["components"]["headers"] = component_headers(codes);
    apply_id_rules(&mut doc);
    let Some(paths) = doc["paths"].as_object_mut() else {
        return doc;
    };
    for (path, item) in paths.iter_mut() {
        for method in METHODS {
            if let Some(operation) = item.get_mut(method) {
                complete_operation(path, method, operation);
            }
        }
    }
    doc
}

fn component_headers(codes: Vec<Value>) -> Value {
    json!({
        "RequestId": {
            "description": format!("The request's id: the client's own when it is {}, else one made by the edge (or the core). In both services' access logs.", REQUEST_ID.describe()),
            "required": true,
            "schema": id_schema(&REQUEST_ID),
        },
        "ErrorCode": {
            "description": "The body's `error`, for proxies that act without reading bodies.",
            "required": true,
            "schema": {"type": "string", "enum": codes},
        },
        "RetryAfter": {
            "description": "Seconds to wait before sending the same request again.",
            "required": true,
            "schema": {"type": "integer", "minimum": 0},
        },
        "IdempotentReplayed": {
            "description": "`true` when this 201 repeats the reservation an earlier request with the same orderId made.",
            "required": false,
            "schema": {"type": "string", "enum": ["true"]},
        },
        "ServedBy": {
            "description": "`edge` when the edge answered without asking a core.",
            "required": false,
            "schema": {"type": "string", "enum": ["edge"]},
        },
    })
}

/// The contract's identifier rules, by the name a path parameter or a body property has:
/// the document states them from the one place edge and core check them, never as a
/// copied regex.
fn id_rule(name: &str) -> Option<(&'static IdRule, &'static str)> {
    match name {
        "code" => Some((&VOUCHER_CODE, "Voucher code")),
        "orderId" => Some((&ORDER_ID, "The order's id")),
        "customerId" => Some((&CUSTOMER_ID, "The customer's id")),
        _ => None,
    }
}

fn id_schema(rule: &IdRule) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": rule.max_len, "pattern": rule.pattern()})
}

/// Puts each identifier's rule on every path parameter and string property named after it.
fn apply_id_rules(doc: &mut Value) {
    if let Some(schemas) = doc["components"]["schemas"].as_object_mut() {
        for schema in schemas.values_mut() {
            let Some(properties) = schema["properties"].as_object_mut() else {
                continue;
            };
            for (name, property) in properties.iter_mut() {
                let Some((rule, _)) = id_rule(name) else {
                    continue;
                };
                if property["type"] == "string" {
                    property["minLength"] = json!(1);
                    property["maxLength"] = json!(rule.max_len);
                    property["pattern"] = json!(rule.pattern());
                }
            }
        }
    }
    let Some(paths) = doc["paths"].as_object_mut() else {
        return;
    };
    for item in paths.values_mut() {
        for method in METHODS {
            let Some(parameters) = item
                .get_mut(method)
                .and_then(|o| o.get_mut("parameters"))
                .and_then(Value::as_array_mut)
            else {
                continue;
            };
            for parameter in parameters.iter_mut() {
                if parameter["in"] != "path" {
                    continue;
                }
                let Some((rule, what)) = parameter["name"].as_str().and_then(id_rule) else {
                    continue;
                };
                parameter["description"] = json!(format!("{what}: {}", rule.describe()));
                parameter["schema"] = id_schema(rule);
            }
        }
    }
}

fn header_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/headers/{name}") })
}

fn complete_operation(path: &str, method: &str, operation: &mut Value) {
    let admin = operation["security"].is_array();
    let responses = operation["responses"]
        .as_object_mut()
        .map(std::mem::take)
        .unwrap_or_default();
    let mut responses = responses;
    // The edge answers its own /healthz before anything else; everything else it forwards.
    if path != "/healthz" {
        for (status, description) in EDGE_ANSWERS {
            add_answer(&mut responses, status, description);
        }
        if admin {
            add_answer(
                &mut responses,
                "403",
                "FORBIDDEN (edge): admin calls are not served on the public listener",
            );
        }
    }
    for (status, response) in responses.iter_mut() {
        let status: u16 = status.parse().unwrap_or(0);
        let headers = response["headers"]
            .as_object_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        let mut headers = headers;
        headers.insert(headers::REQUEST_ID.into(), header_ref("RequestId"));
        headers.insert(headers::SERVED_BY.into(), header_ref("ServedBy"));
        if status >= 400 {
            headers.insert(headers::ERROR_CODE.into(), header_ref("ErrorCode"));
            let code = first_code(response["description"].as_str().unwrap_or_default())
                .unwrap_or(ErrorCode::ServiceUnavailable);
            if let Some(content) = json_content(response) {
                content.insert(
                    "example".into(),
                    json!({ "error": code.as_str(), "message": example_message(code) }),
                );
            }
        }
        if status == 503 || status == 429 {
            headers.insert("Retry-After".into(), header_ref("RetryAfter"));
        }
        if status == 201 && method == "post" && path.ends_with("/reservations") {
            headers.insert(
                headers::IDEMPOTENT_REPLAYED.into(),
                header_ref("IdempotentReplayed"),
            );
        }
        if let Some(binary) = response
            .get_mut("content")
            .and_then(|c| c.get_mut("application/octet-stream"))
        {
            // Bytes, not an array of integers (what utoipa makes of `Vec<u8>`).
            binary["schema"] = json!({"type": "string", "format": "binary"});
        }
        if status < 400 {
            if let Some(content) = json_content(response) {
                let schema = content["schema"]["$ref"].as_str().unwrap_or_default();
                if let Some(example) = success_example(schema) {
                    content.insert("example".into(), example);
                }
            }
        }
        response["headers"] = Value::Object(headers);
    }
    operation["responses"] = Value::Object(responses);
}

/// The `application/json` content of a response, if it has one (never adds one).
fn json_content(response: &mut Value) -> Option<&mut Map<String, Value>> {
    response
        .get_mut("content")?
        .get_mut("application/json")?
        .as_object_mut()
}

/// Adds the edge's answer `status` to `responses`, or its code to the description of the
/// core's answer with the same status.
fn add_answer(responses: &mut Map<String, Value>, status: &str, text: &str) {
    match responses.get_mut(status) {
        Some(existing) => {
            let before = existing["description"].as_str().unwrap_or_default();
            existing["description"] = json!(format!("{before}; or {text}"));
        }
        None => {
            responses.insert(
                status.into(),
                json!({
                    "description": text,
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                }),
            );
        }
    }
}

/// The first error code a response's description names (they start with it).
fn first_code(description: &str) -> Option<ErrorCode> {
    description
        .split(|c: char| !(c.is_ascii_uppercase() || c == '_'))
        .find_map(|word| ErrorCode::parse(word.as_bytes()))
}

fn example_message(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::OutOfStock => "the voucher has no uses left",
        ErrorCode::VoucherPaused => {
            "the voucher is paused: it takes no new reservation until it is resumed"
        }
        ErrorCode::PreconditionFailed => {
            "the voucher changed since the version named in If-Match; read it again"
        }
        ErrorCode::ServiceUnavailable => {
            "a dependency is unavailable; retry after Retry-After seconds"
        }
        ErrorCode::RateLimited => {
            "too many requests from this address; retry after the Retry-After seconds"
        }
        ErrorCode::InvalidRequest => "orderId: 1 to 64 of A-Z a-z 0-9 - _ . :",
        _ => "see the error code",
    }
}

fn ledger_example() -> Value {
    json!({
        "orderId": "order-1001", "customerId": "42", "status": "CONFIRMED",
        "orderAmount": 250000, "discountAmount": 100000,
        "reservedAt": "2026-11-30T12:00:00Z", "expiresAt": "2026-11-30T12:15:00Z",
        "confirmedAt": "2026-11-30T12:04:10Z",
    })
}

fn success_example(schema_ref: &str) -> Option<Value> {
    let name = schema_ref.rsplit('/').next()?;
    Some(match name {
        "ReservationView" => json!({
            "orderId": "order-1001", "voucherCode": "FLASH100", "customerId": "42",
            "orderAmount": 250000, "discountAmount": 100000, "status": "RESERVED",
            "reservedAt": "2026-11-30T12:00:00Z", "expiresAt": "2026-11-30T12:15:00Z",
        }),
        "VoucherView" => json!({
            "code": "FLASH100", "state": "active", "phase": "live", "version": 3,
            "updatedAt": "2026-11-30T12:30:00Z", "discountAmount": 100000, "minOrderAmount": 0,
            "totalLimit": 1000, "perUserLimit": 1,
            "startsAt": "2026-11-30T12:00:00Z", "endsAt": "2026-12-01T12:00:00Z",
            "mode": "flash", "createdAt": "2026-11-29T09:00:00Z",
            "usedCount": 1000, "remaining": 0, "reserved": 400, "confirmed": 600,
            "gateRemaining": 0,
        }),
        "VoucherPage" => json!({
            "items": [{
                "code": "FLASH100", "mode": "flash", "state": "paused", "phase": "live",
                "version": 4, "discountAmount": 100000, "minOrderAmount": 0,
                "totalLimit": 1000, "perUserLimit": 1, "usedCount": 812,
                "startsAt": "2026-11-30T12:00:00Z", "endsAt": "2026-12-01T12:00:00Z",
                "updatedAt": "2026-11-30T12:31:00Z",
            }],
            "nextCursor": "464c415348313030",
        }),
        "AuditPage" => json!({
            "items": [{
                "id": 17, "at": "2026-11-30T12:31:00Z", "actor": "admin", "action": "pause",
                "code": "FLASH100", "requestId": "4f1c2a9e0b7d3c11",
                "before": {"state": "active", "version": 3, "totalLimit": 1000},
                "after": {"state": "paused", "version": 4, "totalLimit": 1000},
            }],
        }),
        "LedgerEntry" => ledger_example(),
        "ReservationPage" => json!({"items": [ledger_example()], "nextCursor": "184467"}),
        "GateReload" => json!({"code": "FLASH100", "status": "REBUILDING"}),
        "OrderIds" => json!({"code": "FLASH100", "orderIds": ["order-1001", "order-1002"]}),
        "Health" => json!({"status": "ok"}),
        "Readiness" => json!({
            "status": "ready",
            "consumer": {"lastReadSecsAgo": 0.4, "error": null,
                "partitions": [{"partition": 0, "lag": 0, "unwrittenAgeSecs": 0.0}]},
        }),
        _ => return None,
    })
}
