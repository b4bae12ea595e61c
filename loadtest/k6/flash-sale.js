// A flash sale on one hot voucher, open model: a constant arrival rate whatever the
// latency, so a slow service cannot slow the load down.
//
//   k6 run loadtest/k6/flash-sale.js
//   RATE=3000 DURATION=20s LIMIT=1000 MODE=flash BASE_URL=http://edge:8080 k6 run ...
//
// Ends by reading the voucher: the run fails unless usedCount equals the limit (sold out,
// never over), and fails on more than MAX_503_SHARE answers 503 (see lib.js).
import exec from 'k6/execution';
import { saleSetup, saleIteration, saleOptions, saleTeardown, summaries } from './lib.js';

export const options = saleOptions(1000, 200, 1000);

export function setup() {
  return saleSetup('K6F', 1000, __ENV.MODE || 'flash');
}

export default function (data) {
  saleIteration(data, exec.scenario.iterationInTest);
}

export const teardown = saleTeardown;

export function handleSummary(data) {
  return summaries(data);
}
