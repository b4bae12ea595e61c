// Shared by the k6 scripts: configuration from environment variables, voucher creation,
// one reservation with its outcome counted by error code, and the end-of-run summary.
//
//   BASE_URL     where clients send reservations (the edge)     default http://127.0.0.1:8080
//   ADMIN_URL    where admin calls go (a core)                   default http://127.0.0.1:8081
//   ADMIN_TOKEN  bearer token of admin calls                     default dev-admin-token
//   CODE         use this existing voucher instead of creating one
//   P99_MS       latency threshold (default 100; CI's smoke on debug builds raises it)
//   SUMMARY_JSON where to write the summary as JSON too (for CI), beside the text on stdout
//   MAX_DROPPED_SHARE  share of planned requests k6 itself may fail to start (default 0.01;
//                CI's smoke, sharing two cores with other tests, raises it)
//   MAX_503_SHARE  share of answers that may be 503 (default 0.01): a sale where the
//                service is down fails, it does not pass on "expected" 503s
//   RETRIES      retries of a 503 or 429, each after its Retry-After (default 2)
//   RUN_ID       tells this run's orderIds and customers from earlier runs' (default: made
//                up at start), so a second run on the same CODE is a new crowd, not replays
import http from 'k6/http';
import { check, sleep } from 'k6';
import { Counter, Rate, Trend } from 'k6/metrics';

export const BASE_URL = __ENV.BASE_URL || 'http://127.0.0.1:8080';
export const ADMIN_URL = __ENV.ADMIN_URL || 'http://127.0.0.1:8081';
export const ADMIN_TOKEN = __ENV.ADMIN_TOKEN || 'dev-admin-token';
const JSON_HEADERS = { 'Content-Type': 'application/json' };

// Outcomes of reservations, one counter per code so the summary can print them.
export const issued = new Counter('voucher_issued');
export const retried = new Counter('voucher_retried');
const byCode = {
  OUT_OF_STOCK: new Counter('voucher_rejected_out_of_stock'),
  ALREADY_USED: new Counter('voucher_rejected_already_used'),
  NOT_ELIGIBLE: new Counter('voucher_rejected_not_eligible'),
  SERVICE_UNAVAILABLE: new Counter('voucher_rejected_unavailable'),
};
const otherRejections = new Counter('voucher_rejected_other');
// Answers no correct run should give: 5xx other than 503, 4xx other than the expected ones.
export const unexpected = new Rate('voucher_unexpected');
export const acceptedLatency = new Trend('voucher_accepted_duration', true);
export const rejectedLatency = new Trend('voucher_rejected_duration', true);
// Every answer, 503 or not (retried ones included): the share of 503s has a threshold.
export const unavailable = new Rate('voucher_unavailable');
// Set by the teardown of a sale: 1 when the stock sold out exactly (usedCount equals the
// limit, and this run's 201s are the uses it took), 0 otherwise; a threshold wants 1.
export const soldOutExactly = new Rate('voucher_sold_out_exactly');

export const MAX_RETRIES = Number(__ENV.RETRIES || 2);
// Longest wait a Retry-After may impose on a VU (seconds).
const MAX_RETRY_WAIT = 5;

/** An id of this run: a prefix of every orderId and customerId it sends. */
export function runId() {
  return __ENV.RUN_ID || `${Date.now().toString(36)}${Math.floor(Math.random() * 1e6).toString(36)}`;
}

/** Creates a voucher valid for a day (unless CODE is set) and returns its code. */
export function createVoucher(prefix, totalLimit, perUserLimit, mode) {
  if (__ENV.CODE) {
    return __ENV.CODE;
  }
  const code = `${prefix}${Date.now()}`.slice(0, 32);
  const now = new Date();
  const body = {
    code,
    discountAmount: 100000,
    minOrderAmount: 0,
    totalLimit,
    perUserLimit,
    startsAt: new Date(now.getTime() - 60000).toISOString(),
    endsAt: new Date(now.getTime() + 86400000).toISOString(),
    mode,
  };
  const res = http.post(`${ADMIN_URL}/vouchers`, JSON.stringify(body), {
    headers: { ...JSON_HEADERS, Authorization: `Bearer ${ADMIN_TOKEN}` },
  });
  if (res.status !== 201) {
    throw new Error(`creating ${code}: ${res.status} ${res.body}`);
  }
  return code;
}

/**
 * A call that retries 503 and 429 as a client should: after the answer's Retry-After
 * (seconds), the same request again (the orderId makes a reservation safe to repeat), at
 * most MAX_RETRIES times. Each retry records a check: that the answer said when to retry.
 */
export function withRetries(send) {
  let res = send();
  unavailable.add(res.status === 503);
  for (let attempt = 0; attempt < MAX_RETRIES && (res.status === 503 || res.status === 429); attempt++) {
    const after = Number(res.headers['Retry-After']);
    check(res, { [`${res.status} says when to retry (Retry-After)`]: () => Number.isFinite(after) && after >= 0 });
    sleep(Math.min(Number.isFinite(after) ? after : 1, MAX_RETRY_WAIT));
    res = send();
    unavailable.add(res.status === 503);
  }
  return res;
}

/** One reservation (retried after a 503 as above); counts its final outcome. */
export function reserve(code, customerId, orderId, expectedCodes) {
  const res = withRetries(() =>
    http.post(
      `${BASE_URL}/vouchers/${code}/reservations`,
      JSON.stringify({ customerId, orderId, orderAmount: 250000 }),
      { headers: JSON_HEADERS, tags: { name: 'reserve' }, responseCallback: http.expectedStatuses(201, 409, 422, 503) },
    ),
  );
  if (res.status === 201) {
    if (res.headers['Idempotent-Replayed'] === 'true') {
      retried.add(1);
    } else {
      issued.add(1);
    }
    acceptedLatency.add(res.timings.duration);
    unexpected.add(false);
    return res;
  }
  rejectedLatency.add(res.timings.duration);
  let error = 'UNREADABLE';
  try {
    error = res.json('error');
  } catch (_) {
    // not JSON: counted as other
  }
  (byCode[error] || otherRejections).add(1);
  unexpected.add(!(expectedCodes || ['OUT_OF_STOCK', 'ALREADY_USED', 'SERVICE_UNAVAILABLE']).includes(error));
  return res;
}

/** The voucher as the service reports it. */
export function voucherState(code) {
  const res = http.get(`${BASE_URL}/vouchers/${code}`, { tags: { name: 'get_voucher' } });
  return res.status === 200 ? res.json() : null;
}

function count(data, name) {
  const m = data.metrics[name];
  return m ? m.values.count : 0;
}

function rate(data, name) {
  const m = data.metrics[name];
  return m ? (m.values.rate * 100).toFixed(2) + '%' : '-';
}

function checks(data) {
  const m = data.metrics.checks;
  return m ? `${m.values.passes} passed, ${m.values.fails} failed` : 'none';
}

function soldOut(data) {
  const m = data.metrics.voucher_sold_out_exactly;
  if (!m) return 'not checked';
  return m.values.rate === 1 ? 'yes' : 'NO';
}

function trend(data, name, stat) {
  const m = data.metrics[name];
  return m && m.values[stat] !== undefined ? m.values[stat].toFixed(1) : '-';
}

/** A plain-text summary: offered vs achieved load, issued uses, rejections by code, latency. */
export function summary(data) {
  const iterations = count(data, 'iterations');
  const dropped = count(data, 'dropped_iterations');
  const seconds = data.state.testRunDurationMs / 1000;
  const lines = [
    '',
    `requests sent        ${iterations} in ${seconds.toFixed(1)} s (${(iterations / seconds).toFixed(0)}/s achieved), dropped iterations ${dropped}`,
    `issued uses          ${count(data, 'voucher_issued')} (+ ${count(data, 'voucher_retried')} retries answered with their first 201)`,
    `OUT_OF_STOCK         ${count(data, 'voucher_rejected_out_of_stock')}`,
    `ALREADY_USED         ${count(data, 'voucher_rejected_already_used')}`,
    `NOT_ELIGIBLE         ${count(data, 'voucher_rejected_not_eligible')}`,
    `SERVICE_UNAVAILABLE  ${count(data, 'voucher_rejected_unavailable')}`,
    `other rejections     ${count(data, 'voucher_rejected_other')}`,
    `503 share            ${rate(data, 'voucher_unavailable')} of all answers (retries included)`,
    `sold out exactly     ${soldOut(data)}`,
    `checks               ${checks(data)}`,
    `accepted latency ms  p50 ${trend(data, 'voucher_accepted_duration', 'med')}  p99 ${trend(data, 'voucher_accepted_duration', 'p(99)')}  max ${trend(data, 'voucher_accepted_duration', 'max')}`,
    `rejected latency ms  p50 ${trend(data, 'voucher_rejected_duration', 'med')}  p99 ${trend(data, 'voucher_rejected_duration', 'p(99)')}  max ${trend(data, 'voucher_rejected_duration', 'max')}`,
  ];
  const failed = Object.entries(data.metrics)
    .filter(([, m]) => m.thresholds && Object.values(m.thresholds).some((t) => !t.ok))
    .map(([name]) => name);
  lines.push(failed.length ? `thresholds FAILED: ${failed.join(', ')}` : 'thresholds passed');
  return lines.join('\n') + '\n';
}

/**
 * handleSummary of every script: the text summary on stdout and, when SUMMARY_JSON names a
 * file, the same figures as JSON there, for a CI to read.
 */
export function summaries(data) {
  const out = { stdout: summary(data) };
  if (__ENV.SUMMARY_JSON) {
    out[__ENV.SUMMARY_JSON] = JSON.stringify(summaryJson(data), null, 2);
  }
  return out;
}

/** The summary's figures as one object (counts, latency in ms, failed thresholds). */
export function summaryJson(data) {
  const latency = (name) => ({
    p50: data.metrics[name] ? data.metrics[name].values.med : null,
    p99: data.metrics[name] ? data.metrics[name].values['p(99)'] : null,
    max: data.metrics[name] ? data.metrics[name].values.max : null,
  });
  return {
    durationSeconds: data.state.testRunDurationMs / 1000,
    requests: count(data, 'iterations'),
    droppedIterations: count(data, 'dropped_iterations'),
    issued: count(data, 'voucher_issued'),
    retried: count(data, 'voucher_retried'),
    rejected: {
      OUT_OF_STOCK: count(data, 'voucher_rejected_out_of_stock'),
      ALREADY_USED: count(data, 'voucher_rejected_already_used'),
      NOT_ELIGIBLE: count(data, 'voucher_rejected_not_eligible'),
      SERVICE_UNAVAILABLE: count(data, 'voucher_rejected_unavailable'),
      other: count(data, 'voucher_rejected_other'),
    },
    unavailableShare: data.metrics.voucher_unavailable ? data.metrics.voucher_unavailable.values.rate : null,
    soldOutExactly: data.metrics.voucher_sold_out_exactly ? data.metrics.voucher_sold_out_exactly.values.rate === 1 : null,
    checks: data.metrics.checks ? { passed: data.metrics.checks.values.passes, failed: data.metrics.checks.values.fails } : null,
    acceptedLatencyMs: latency('voucher_accepted_duration'),
    rejectedLatencyMs: latency('voucher_rejected_duration'),
    thresholdsFailed: Object.entries(data.metrics)
      .filter(([, m]) => m.thresholds && Object.values(m.thresholds).some((t) => !t.ok))
      .map(([name]) => name),
  };
}

export const summaryTrendStats = ['med', 'p(95)', 'p(99)', 'max'];

/** Seconds in a k6 duration such as `30s`, `2m` or `1m30s`. */
function seconds(duration) {
  let total = 0;
  for (const [, n, unit] of duration.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h)/g)) {
    total += Number(n) * { ms: 0.001, s: 1, m: 60, h: 3600 }[unit];
  }
  return total || 10;
}

/** The latency threshold (p99, ms): 100 by default, P99_MS to change it. */
export const P99_MS = Number(__ENV.P99_MS || 100);

/** The share of 503 answers a run may see (MAX_503_SHARE, default 1%). */
export const MAX_503_SHARE = Number(__ENV.MAX_503_SHARE || 0.01);

/**
 * Options of a one-voucher sale at a constant arrival rate (RATE/s for DURATION), with
 * thresholds: the stock sells out exactly, no unexpected answer, 503s under
 * MAX_503_SHARE, p99 under P99_MS for accepted and rejected requests.
 */
export function saleOptions(defaultRate, defaultVus, defaultMaxVus) {
  const rate = Number(__ENV.RATE || defaultRate);
  const duration = __ENV.DURATION || '10s';
  const planned = rate * seconds(duration);
  const maxDropped = Math.max(1, Math.floor(planned * Number(__ENV.MAX_DROPPED_SHARE || 0.01)));
  return {
    summaryTrendStats,
    scenarios: {
      sale: {
        executor: 'constant-arrival-rate',
        rate,
        timeUnit: '1s',
        duration,
        preAllocatedVUs: Number(__ENV.VUS || defaultVus),
        maxVUs: Number(__ENV.MAX_VUS || defaultMaxVus),
      },
    },
    thresholds: {
      voucher_sold_out_exactly: ['rate==1'],
      voucher_unexpected: ['rate<0.001'],
      voucher_unavailable: [`rate<=${MAX_503_SHARE}`],
      checks: ['rate==1'],
      voucher_rejected_duration: [`p(99)<${P99_MS}`],
      voucher_accepted_duration: [`p(99)<${P99_MS}`],
      // Iterations k6 could not start in time: a generator short of VUs or CPU, not an
      // answer of the system; bounded so that a run that offered far less load fails.
      dropped_iterations: [`count<${maxDropped}`],
    },
  };
}

/**
 * setup() of a sale: the voucher (made, or CODE), this run's id, and the uses it had
 * before the run (a CODE may have sold some already).
 */
export function saleSetup(prefix, defaultLimit, mode) {
  const code = createVoucher(prefix, Number(__ENV.LIMIT || defaultLimit), 1, mode);
  const before = voucherState(code);
  if (!before) {
    throw new Error(`voucher ${code} cannot be read at ${BASE_URL}`);
  }
  return { code, run: runId(), usedBefore: before.usedCount };
}

/**
 * One customer's reservation in a sale: this run's id and the iteration number make the
 * customer and the orderId unique, across runs too.
 */
export function saleIteration(data, iteration) {
  reserve(data.code, `k6-${data.run}-c${iteration}`, `${data.run}-o${iteration}`);
}

/**
 * Reads the voucher at the end. The sale passed only if its stock sold out exactly:
 * usedCount equals the limit (over it is an oversell and throws). The threshold on
 * voucher_sold_out_exactly turns a sale that left stock unsold (a gate down, a broker
 * stalled) into a failed run.
 */
export function saleTeardown(data) {
  const v = voucherState(data.code);
  if (v && v.usedCount > v.totalLimit) {
    soldOutExactly.add(false);
    throw new Error(`OVERSOLD: ${v.usedCount} uses of ${v.totalLimit}`);
  }
  const exactly = !!v && v.usedCount === v.totalLimit;
  soldOutExactly.add(exactly);
  console.log(
    `voucher ${data.code}: usedCount ${v && v.usedCount} of ${v && v.totalLimit} ` +
      `(${v ? v.usedCount - data.usedBefore : '?'} taken by run ${data.run})` +
      (exactly ? '' : ': NOT SOLD OUT'),
  );
}
