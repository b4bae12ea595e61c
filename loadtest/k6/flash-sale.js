// A flash sale on one hot voucher, open model: a constant arrival rate whatever the
// latency, so a slow service cannot slow the load down.
//
//   k6 run loadtest/k6/flash-sale.js
//   RATE=3000 DURATION=20s LIMIT=1000 MODE=flash BASE_URL=http://edge:8080 k6 run ...
//
// Ends by reading the voucher: usedCount must not exceed the limit.
import exec from 'k6/execution';
import { createVoucher, saleIteration, saleOptions, saleTeardown, summaries } from './lib.js';

export const options = saleOptions(1000, 200, 1000);

export function setup() {
  return { code: createVoucher('K6F', Number(__ENV.LIMIT || 1000), 1, __ENV.MODE || 'flash') };
}

export default function (data) {
  saleIteration(data, exec.scenario.iterationInTest);
}

export const teardown = saleTeardown;

export function handleSummary(data) {
  return summaries(data);
}
