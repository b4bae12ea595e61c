// 50,000 requests with made-up methods and paths through the edge (part of
// ./loadtest/fuzz.sh): whatever a scanner sends, every answer is a 4xx, and the series of
// the edge's and the cores' metrics stay as many (fuzz.sh counts them before and after).
//   BASE_URL (default http://127.0.0.1:8080), REQUESTS (default 50000)
import http from 'k6/http';
import { check } from 'k6';

const BASE_URL = __ENV.BASE_URL || 'http://127.0.0.1:8080';
const REQUESTS = parseInt(__ENV.REQUESTS || '50000', 10);

export const options = {
  scenarios: {
    junk: { executor: 'shared-iterations', vus: 32, iterations: REQUESTS, maxDuration: '10m' },
  },
  thresholds: {
    // Every answer a 4xx: nothing a scanner sends is a 5xx, or taken.
    checks: ['rate==1'],
  },
};

const METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS'];

function token(n) {
  return Math.floor(Math.random() * n).toString(36);
}

export default function () {
  // Half made-up methods (XM<random>), half real ones on made-up paths.
  const method = Math.random() < 0.5
    ? `XM${token(1e9)}`.toUpperCase()
    : METHODS[Math.floor(Math.random() * METHODS.length)];
  const shapes = [
    () => `/${token(1e9)}/${token(1e6)}`,
    () => `/vouchers/${token(1e9)}/${token(1e6)}/${token(1e3)}`,
    () => `/vouchers/${token(1e9)}/reservations/${token(1e9)}/${token(1e3)}`,
    // Percent-escapes of any byte (k6 refuses to send a malformed escape).
    () => `/vouchers/%${Math.floor(Math.random() * 256).toString(16).padStart(2, '0')}${token(1e4)}/reservations`,
    () => `/metrics?${token(1e6)}=${token(1e6)}`,
  ];
  const path = shapes[Math.floor(Math.random() * shapes.length)]();
  const res = http.request(method, `${BASE_URL}${path}`, null, { tags: { name: 'junk' } });
  check(res, { 'a 4xx': (r) => r.status >= 400 && r.status < 500 });
}
