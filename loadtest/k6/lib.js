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
import http from 'k6/http';
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

/** One reservation; counts its outcome. Returns the response. */
export function reserve(code, customerId, orderId, expectedCodes) {
  const res = http.post(
    `${BASE_URL}/vouchers/${code}/reservations`,
    JSON.stringify({ customerId, orderId, orderAmount: 250000 }),
    { headers: JSON_HEADERS, tags: { name: 'reserve' }, responseCallback: http.expectedStatuses(201, 409, 422, 503) },
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

/**
 * Options of a one-voucher sale at a constant arrival rate (RATE/s for DURATION), with
 * thresholds: no unexpected answer, p99 under P99_MS for accepted and rejected requests.
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
      voucher_unexpected: ['rate<0.001'],
      voucher_rejected_duration: [`p(99)<${P99_MS}`],
      voucher_accepted_duration: [`p(99)<${P99_MS}`],
      // Iterations k6 could not start in time: a generator short of VUs or CPU, not an
      // answer of the system; bounded so that a run that offered far less load fails.
      dropped_iterations: [`count<${maxDropped}`],
    },
  };
}

/** One customer's reservation in a sale; iteration numbers make customers and orders unique. */
export function saleIteration(data, iteration) {
  reserve(data.code, `k6-c${iteration}`, `${data.code}-o${iteration}`);
}

/** Reads the voucher at the end: usedCount over the limit fails the run. */
export function saleTeardown(data) {
  const v = voucherState(data.code);
  if (v && v.usedCount > v.totalLimit) {
    throw new Error(`OVERSOLD: ${v.usedCount} uses of ${v.totalLimit}`);
  }
  console.log(`voucher ${data.code}: usedCount ${v && v.usedCount} of ${v && v.totalLimit}`);
}
