// The same hot-voucher sale on a standard-mode voucher: one PostgreSQL transaction per
// reservation on one hot row (the seed article's first solution). Compare with
// flash-sale.js at the same RATE.
//
//   RATE=500 DURATION=10s k6 run loadtest/k6/standard-hot.js
import exec from 'k6/execution';
import { createVoucher, reserve, summary, summaryTrendStats, voucherState } from './lib.js';

const RATE = Number(__ENV.RATE || 500);
const LIMIT = Number(__ENV.LIMIT || 1000);

export const options = {
  summaryTrendStats,
  scenarios: {
    sale: {
      executor: 'constant-arrival-rate',
      rate: RATE,
      timeUnit: '1s',
      duration: __ENV.DURATION || '10s',
      preAllocatedVUs: Number(__ENV.VUS || 100),
      maxVUs: Number(__ENV.MAX_VUS || 500),
    },
  },
  thresholds: {
    voucher_unexpected: ['rate<0.001'],
    voucher_rejected_duration: ['p(99)<100'],
    voucher_accepted_duration: ['p(99)<100'],
  },
};

export function setup() {
  return { code: createVoucher('K6S', LIMIT, 1, 'standard') };
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
