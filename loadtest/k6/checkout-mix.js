// Checkout traffic: each order reserves, sometimes retries the same orderId (a timeout
// on the client side), then confirms (payment succeeded) or releases (cancelled).
//
//   RATE=200 DURATION=30s CONFIRM_RATIO=0.7 RETRY_RATIO=0.1 k6 run loadtest/k6/checkout-mix.js
//
// Fails on more than MAX_503_SHARE answers 503, on a confirm or release that does not
// succeed after its retries (each after the answer's Retry-After), and on counts that do
// not add up at the end (usedCount = reserved + confirmed, never over the limit).
import http from 'k6/http';
import exec from 'k6/execution';
import { check } from 'k6';
import {
  BASE_URL, MAX_503_SHARE, P99_MS, createVoucher, reserve, runId, summaries, summaryTrendStats, voucherState, withRetries,
} from './lib.js';

const RATE = Number(__ENV.RATE || 100);
const CONFIRM_RATIO = Number(__ENV.CONFIRM_RATIO || 0.7);
const RETRY_RATIO = Number(__ENV.RETRY_RATIO || 0.1);

export const options = {
  summaryTrendStats,
  scenarios: {
    checkout: {
      executor: 'constant-arrival-rate',
      rate: RATE,
      timeUnit: '1s',
      duration: __ENV.DURATION || '10s',
      preAllocatedVUs: Number(__ENV.VUS || 50),
      maxVUs: Number(__ENV.MAX_VUS || 300),
    },
  },
  thresholds: {
    voucher_unexpected: ['rate<0.001'],
    voucher_unavailable: [`rate<=${MAX_503_SHARE}`],
    checks: ['rate>0.999'],
    'http_req_duration{name:reserve}': [`p(99)<${P99_MS}`],
    // With the broker deciding, flash confirm and release may wait for the writer's row.
    'http_req_duration{name:confirm}': [`p(99)<${2 * P99_MS}`],
    'http_req_duration{name:release}': [`p(99)<${2 * P99_MS}`],
  },
};

export function setup() {
  // Plenty of uses, few per customer: the mix exercises every call, not the sell-out.
  return { code: createVoucher('K6M', Number(__ENV.LIMIT || 1000000), 2, __ENV.MODE || 'flash'), run: runId() };
}

export default function (data) {
  const i = exec.scenario.iterationInTest;
  // This run's id in both: a second run on the same CODE is new customers and orders.
  const customer = `mix-${data.run}-c${i % 5000}`;
  const order = `${data.run}-m${i}`;
  const first = reserve(data.code, customer, order);
  if (first.status !== 201) {
    return;
  }
  if (Math.random() < RETRY_RATIO) {
    const again = reserve(data.code, customer, order);
    check(again, { 'a retry gets the same reservation': (r) => r.status === 201 && r.json('orderId') === order });
  }
  const url = `${BASE_URL}/vouchers/${data.code}/reservations/${order}`;
  // With the broker deciding, flash reservations reach PostgreSQL through the writers; the
  // core waits for the row, and answers 503 if it takes too long: retry then, after its
  // Retry-After, as a checkout would. (With PostgreSQL deciding the row is there already.)
  const confirm = Math.random() < CONFIRM_RATIO;
  const res = withRetries(() =>
    confirm
      ? http.post(`${url}/confirm`, null, { tags: { name: 'confirm' }, responseCallback: http.expectedStatuses(200, 503) })
      : http.del(url, null, { tags: { name: 'release' }, responseCallback: http.expectedStatuses(200, 503) }),
  );
  check(res, { 'confirm or release succeeds': (r) => r.status === 200 });
}

export function teardown(data) {
  const v = voucherState(data.code);
  if (!v || v.usedCount > v.totalLimit || v.usedCount !== v.reserved + v.confirmed) {
    throw new Error(`inconsistent counts: ${JSON.stringify(v)}`);
  }
  console.log(`voucher ${data.code}: reserved ${v.reserved}, confirmed ${v.confirmed}, usedCount ${v.usedCount} (run ${data.run})`);
}

export function handleSummary(data) {
  return summaries(data);
}
