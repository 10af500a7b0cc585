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
  ["loloha", { epsilon: 2, domain_size: 1024 }],
];

/** The numeric and heavy-hitter kinds: [name, params, value of report i]. */
export const KIND_SPECS = [
  ["duchi", { epsilon: 1, low: 0, high: 240 }, (i) => i % 241],
  ["pm", { epsilon: 1, low: 0, high: 240 }, (i) => i % 241],
  ["hm", { epsilon: 1, low: 0, high: 240 }, (i) => i % 241],
  ["sw", { epsilon: 1, low: 0, high: 240, bins: 64 }, (i) => i % 241],
  ["1bitmean", { epsilon: 1, low: 0, high: 100, granularity: 16 }, (i) => i % 101],
  ["dbitflip", { epsilon: 1, low: 0, high: 100, buckets: 32 }, (i) => i % 101],
  ["pem", { epsilon: 4, length: 8, start_bits: 12, step_bits: 4 }, (i) => "w" + (i % 100)],
  ["sfp", { epsilon: 4, length: 8 }, (i) => "w" + (i % 100)],
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
    const one = spec.memoized ? (i) => spec.encodeMemoized(i % d, key, rng) : (i) => spec.encodeOne(i % d, rng);
    out[name] = { spec: spec.canonical, ...timePerCall(now, one) };
  }
  // the other kinds through the client's own dispatch (memoized ones with this device's key, warm)
  for (const [name, params, valueOf] of KIND_SPECS) {
    const spec = ldp.makeSpec(name, params);
    const prepared = [];
    for (let i = 0; i < 100; i++) prepared.push(spec.kind === "heavy_hitters" ? spec.pad(valueOf(i)) : valueOf(i));
    const ctx = { rng, deviceSecret: key, metricKey: () => key };
    out[name] = { spec: spec.canonical, ...timePerCall(now, (i) => ldp.encodeReport(spec, prepared[i % 100], ctx)) };
  }
  return out;
}

export const BENCH_METRICS = {
  format: "ldp-metrics/1",
  metrics: {
    word: { description: "bench", owner: "b@example.org", expires: "2099-12-31", mechanism: { mechanism: "olh", epsilon: 1.0 }, domain: { kind: "hashed", size: 1024, seed: 0 }, max_reports_per_day: 10 },
    ...Object.fromEntries(
      KIND_SPECS.map(([name, params]) => {
        const hh = name === "pem" || name === "sfp";
        const { length, ...mech } = params;
        const domain = hh ? { kind: "string", length } : { kind: "range", low: params.low, high: params.high };
        if (!hh) {
          delete mech.low;
          delete mech.high;
        }
        return [`k_${name}`, { description: "bench", owner: "b@example.org", expires: "2099-12-31", mechanism: { mechanism: name, ...mech }, domain, max_reports_per_day: 1 }];
      }),
    ),
    k_loloha: { description: "bench", owner: "b@example.org", expires: "2099-12-31", mechanism: { mechanism: "loloha", epsilon: 2 }, domain: { kind: "hashed", size: 1024, seed: 0 }, max_reports_per_day: 1 },
  },
};

/** record()'s own cost (what the app's thread pays): the domain mapping and the queue, not the encoding;
 * per metric kind ("word" is the frequency oracle OLH; k_<mechanism> the others). */
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
  const kinds = {};
  for (const [name, , valueOf] of KIND_SPECS) kinds[name] = timePerCall(now, (i) => client.record(`k_${name}`, valueOf(i)), 200);
  kinds.loloha = timePerCall(now, (i) => client.record("k_loloha", "w" + (i % 100)), 200);
  const refused = Object.keys(client.errors()).filter((k) => client.errors()[k] > 0);
  await client.close({ upload: false });
  if (refused.length) throw new Error(`the benchmark's records were refused: ${JSON.stringify(client.errors())}`);
  return { ...r, kinds };
}
