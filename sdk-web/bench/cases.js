// The encoder benchmark shared by Node (bench/encode.ts) and Chromium (bench/chromium.ts): plain
// JavaScript over the SDK's public API, so the same code runs in both. Per mechanism: 2,000 warm-up
// reports, then 41 samples of 500 reports each; the per-report time of each sample, p50 and p90.
export const SPECS = [
  ["rr", { epsilon: 1 }],
  ["grr", { epsilon: 1, domain_size: 64 }],
  ["oue", { epsilon: 1, domain_size: 64 }],
  ["olh", { epsilon: 1, domain_size: 1024 }],
  ["rappor", { epsilon: 2, domain_size: 64 }],
  ["cms", { epsilon: 2, domain_size: 1024 }],
  ["hcms", { epsilon: 2, domain_size: 65536, num_hashes: 64, width: 1024 }],
  ["hr", { epsilon: 1, domain_size: 1024 }],
];

function quantiles(samples) {
  samples.sort((a, b) => a - b);
  return { p50_us: +samples[20].toFixed(3), p90_us: +samples[36].toFixed(3) };
}

/** Time `fn` per call: 41 samples of `per` calls. */
export function timePerCall(now, fn, per = 500) {
  for (let i = 0; i < 4 * per; i++) fn(i);
  const samples = [];
  for (let s = 0; s < 41; s++) {
    const t0 = now();
    for (let i = 0; i < per; i++) fn(i);
    samples.push(((now() - t0) * 1000) / per);
  }
  return quantiles(samples);
}

export function benchEncoders(ldp, now) {
  const rng = new ldp.CryptoSource();
  const key = rng.bytes(32);
  const out = {};
  for (const [name, params] of SPECS) {
    const spec = ldp.makeSpec(name, params);
    const d = spec.domainSize;
    const one = spec instanceof ldp.RapporSpec ? (i) => spec.encodeMemoized(i % d, key, rng) : (i) => spec.encodeOne(i % d, rng);
    out[name] = { spec: spec.canonical, ...timePerCall(now, one) };
  }
  return out;
}

export const BENCH_METRICS = {
  format: "ldp-metrics/1",
  metrics: {
    word: { description: "bench", owner: "b@example.org", expires: "2099-12-31", mechanism: { mechanism: "olh", epsilon: 1.0 }, domain: { kind: "hashed", size: 1024, seed: 0 }, max_reports_per_day: 10 },
  },
};

/** record()'s own cost (what the app's thread pays): the domain mapping and the queue, not the encoding. */
export async function benchRecord(ldp, now, options) {
  const client = await ldp.TelemetryClient.open({
    collectorUrl: "http://127.0.0.1:9",
    metrics: BENCH_METRICS,
    policy: new ldp.LocalPolicy({ perMetricDaily: 10, totalDaily: 10 }),
    uploadIntervalMs: 0,
    lifecycle: false,
    maxQueue: 1 << 22,
    ...options,
  });
  const r = timePerCall(now, (i) => client.record("word", "w" + (i % 100)), 200);
  await client.close({ upload: false });
  return r;
}
