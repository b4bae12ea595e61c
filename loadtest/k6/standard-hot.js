// The same hot-voucher sale on a standard-mode voucher: PostgreSQL alone decides, on one
// hot row, in groups of the reservations that arrive together (see ARCHITECTURE.md,
// Standard mode). Compare with flash-sale.js at the same RATE.
//
//   RATE=300 DURATION=10s k6 run loadtest/k6/standard-hot.js
import exec from 'k6/execution';
import { saleSetup, saleIteration, saleOptions, saleTeardown, summaries } from './lib.js';

export const options = saleOptions(300, 100, 500);

export function setup() {
  return saleSetup('K6S', 1000, 'standard');
}

export default function (data) {
  saleIteration(data, exec.scenario.iterationInTest);
}

export const teardown = saleTeardown;

export function handleSummary(data) {
  return summaries(data);
}
