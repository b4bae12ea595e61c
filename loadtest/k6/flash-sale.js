// A flash sale on one hot voucher, open model: a constant arrival rate whatever the
// latency, so a slow service cannot slow the load down.
//
//   k6 run loadtest/k6/flash-sale.js
//   RATE=3000 DURATION=20s LIMIT=1000 MODE=flash BASE_URL=http://edge:8080 k6 run ...
//
// Ends by reading the voucher: usedCount must not exceed the limit.
import exec from 'k6/execution';
import { createVoucher, reserve, summary, summaryTrendStats, voucherState } from './lib.js';

const RATE = Number(__ENV.RATE || 1000);
const LIMIT = Number(__ENV.LIMIT || 1000);

export const options = {
  summaryTrendStats,
  scenarios: {
    sale: {
      executor: 'constant-arrival-rate',
      rate: RATE,
      timeUnit: '1s',
      duration: __ENV.DURATION || '10s',
      preAllocatedVUs: Number(__ENV.VUS || 200),
      maxVUs: Number(__ENV.MAX_VUS || 1000),
    },
  },
  thresholds: {
    voucher_unexpected: ['rate<0.001'],
    voucher_rejected_duration: ['p(99)<100'],
    voucher_accepted_duration: ['p(99)<100'],
    dropped_iterations: [`count<${Math.max(1, Math.floor(RATE * 0.01))}`],
  },
};

export function setup() {
  return { code: createVoucher('K6F', LIMIT, 1, __ENV.MODE || 'flash') };
}

export default function (data) {
  const i = exec.scenario.iterationInTest;
  reserve(data.code, `k6-c${i}`, `${data.code}-o${i}`);
}

export function teardown(data) {
  const v = voucherState(data.code);
  if (v && v.usedCount > v.totalLimit) {
    throw new Error(`OVERSOLD: ${v.usedCount} uses of ${v.totalLimit}`);
  }
  console.log(`voucher ${data.code}: usedCount ${v && v.usedCount} of ${v && v.totalLimit}`);
}

export function handleSummary(data) {
  return { stdout: summary(data) };
}
