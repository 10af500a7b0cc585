// The smoke test's page program (plain JavaScript, served as is by test/browser/smoke.ts).
import * as ldp from "./ldp-telemetry.min.js";

async function main() {
  const metrics = await ldp.fetchMetrics(location.origin);
  const policy = new ldp.LocalPolicy({ perMetricDaily: 20, totalDaily: 100 });
  const beacons = [];
  const realBeacon = navigator.sendBeacon.bind(navigator);
  const sendBeacon = (url, data) => {
    let ok = false;
    try {
      ok = realBeacon(url, data);
    } catch {
      ok = false;
    }
    beacons.push(ok);
    return ok;
  };
  const a = await ldp.TelemetryClient.open({ collectorUrl: location.origin, metrics, policy, storageName: "smoke-a", uploadIntervalMs: 0 });
  for (const v of ["a", "b", "c", "a", "zzz"]) a.record("tab", v);
  for (const w of ["hello", "wörld", "😀"]) a.record("word", w);
  a.record("emoji", "e3");
  for (const v of ["x", "z"]) a.record("secret", v); // sealed in the browser at upload
  const flushed = await a.flush();
  const phase1 = { flushed, stats: a.stats(), errors: a.errors(), spent: await a.privacySpent() };
  await a.close();

  let offline = true;
  const flaky = (url, init) => (offline ? Promise.reject(new TypeError("offline")) : fetch(url, init));
  const b = await ldp.TelemetryClient.open({ collectorUrl: location.origin, metrics, policy, storageName: "smoke-b", uploadIntervalMs: 0, fetch: flaky, sendBeacon, lifecycle: true, backoffBaseMs: 1, backoffMaxMs: 1 });
  for (const v of ["d", "e"]) b.record("tab", v);
  await b.flush(); // forms and stores the batch; the send fails
  offline = false;
  window.dispatchEvent(new PageTransitionEvent("pagehide"));
  await new Promise((r) => setTimeout(r, 1500));
  const pendingAfterBeacon = await b.pendingReports();
  const flushedAfter = await b.flush(); // the stored batch again, by fetch: the collector's dedup must hold
  const phase2 = { stats: b.stats(), errors: b.errors(), beacons, pendingAfterBeacon, flushedAfter, pending: await b.pendingReports() };

  let bench = null;
  if (location.hash === "#bench") {
    bench = {};
    const rng = new ldp.CryptoSource();
    const specs = [
      ["rr", { epsilon: 1 }],
      ["grr", { epsilon: 1, domain_size: 64 }],
      ["oue", { epsilon: 1, domain_size: 64 }],
      ["olh", { epsilon: 1, domain_size: 1024 }],
      ["rappor", { epsilon: 2, domain_size: 64 }],
      ["cms", { epsilon: 2, domain_size: 1024 }],
      ["hcms", { epsilon: 2, domain_size: 65536, num_hashes: 64, width: 1024 }],
      ["hr", { epsilon: 1, domain_size: 1024 }],
    ];
    const key = rng.bytes(32);
    for (const [name, params] of specs) {
      const spec = ldp.makeSpec(name, params);
      const one = spec instanceof ldp.RapporSpec ? (v) => spec.encodeMemoized(v, key, rng) : (v) => spec.encodeOne(v, rng);
      for (let i = 0; i < 2000; i++) one(i % spec.domainSize);
      const samples = [];
      for (let s = 0; s < 41; s++) {
        const t0 = performance.now();
        for (let i = 0; i < 500; i++) one(i % spec.domainSize);
        samples.push(((performance.now() - t0) * 1000) / 500);
      }
      samples.sort((x, y) => x - y);
      bench[name] = { p50_us: samples[20], p90_us: samples[36] };
    }
    const c = await ldp.TelemetryClient.open({ collectorUrl: location.origin, metrics, policy, storageName: "bench", uploadIntervalMs: 0, lifecycle: false });
    const rec = [];
    for (let s = 0; s < 41; s++) {
      const t0 = performance.now();
      for (let i = 0; i < 200; i++) c.record("word", "w" + i);
      rec.push(((performance.now() - t0) * 1000) / 200);
    }
    rec.sort((x, y) => x - y);
    bench.record = { p50_us: rec[20], p90_us: rec[36] };
    await c.close({ upload: false });
  }
  window.ldpResult = { phase1, phase2, bench, userAgent: navigator.userAgent };
}

main().catch((e) => {
  window.ldpError = String(e && e.stack ? e.stack : e);
});
