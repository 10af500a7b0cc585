// The journey test's page program (plain JavaScript, served as is by test/browser/journey.ts from the
// page's own origin): a web app that ships its metrics file (metrics/example.json, as text) reads the
// served definitions from the collector at another origin, then simulates its users: each is a
// TelemetryClient with its own IndexedDB database and a seeded random source (simulation mode), records
// the user's values and flushes to the collector. What happened goes to window.ldpResult.
import * as ldp from "./ldp-telemetry.min.js";

async function main() {
  const plan = await (await fetch("./plan.json")).json();
  let metricsError = null;
  let served = null;
  try {
    const set = await ldp.fetchMetrics(plan.collectorUrl);
    served = [...set.metrics.keys(), ...set.unsupported.keys()].sort();
  } catch (e) {
    metricsError = String(e);
  }
  const bundled = ldp.parseMetrics(plan.bundledMetrics);
  const unsupported = Object.fromEntries(bundled.unsupported);
  const fetchErrors = [];
  const watched = (url, init) =>
    fetch(url, init).catch((e) => {
      fetchErrors.push(String(e));
      throw e;
    });
  const policy = new ldp.LocalPolicy(plan.policy);
  const totals = { timing: { open: 0, flush: 0 }, flushed: 0, notFlushed: 0, sent: 0, refused: 0, waiting: {}, pending: 0, stats: {}, errors: {}, rejections: [] };
  const add = (into, from) => {
    for (const [k, v] of Object.entries(from)) if (typeof v === "number") into[k] = (into[k] ?? 0) + v;
  };
  let next = 0;
  const t0 = performance.now();
  async function worker() {
    for (;;) {
      const i = next++;
      if (i >= plan.users.length) return;
      const tOpen = performance.now();
      const client = await ldp.TelemetryClient.open({
        collectorUrl: plan.collectorUrl,
        metrics: plan.bundledMetrics,
        policy,
        storageName: `${plan.storagePrefix}-${i}`,
        simulation: true,
        random: new ldp.SimulationSource(plan.seed + i),
        fetch: watched,
        uploadIntervalMs: 0,
        lifecycle: false,
        backoffBaseMs: 1,
        backoffMaxMs: 1,
        ...(plan.tokens ? { tokens: { ...plan.tokens, device: plan.devices[i] } } : {}),
      });
      for (const [metric, values] of Object.entries(plan.users[i])) for (const v of values) client.record(metric, v);
      const tFlush = performance.now();
      const result = await client.flushResult();
      totals.timing.open += tFlush - tOpen;
      totals.timing.flush += performance.now() - tFlush;
      if (result.ok) totals.flushed++;
      else totals.notFlushed++;
      totals.sent += result.sent.reports;
      totals.refused += result.refused.reports;
      if (result.waiting) totals.waiting[result.waiting.reason] = (totals.waiting[result.waiting.reason] ?? 0) + 1;
      totals.pending += await client.pendingReports();
      add(totals.stats, client.stats());
      add(totals.errors, client.errors());
      const rejection = client.lastRejection();
      if (rejection) totals.rejections.push(rejection);
      await client.close({ upload: false });
    }
  }
  await Promise.all(Array.from({ length: plan.concurrency }, worker));
  // what each device kept, read back from its database by a new client (as after a reload)
  const kept = [];
  if (plan.reopen) {
    for (let i = 0; i < plan.users.length; i++) {
      const again = await ldp.TelemetryClient.open({ collectorUrl: plan.collectorUrl, metrics: plan.bundledMetrics, policy, storageName: `${plan.storagePrefix}-${i}`, uploadIntervalMs: 0, lifecycle: false });
      kept.push(await again.pendingReports());
      await again.close({ upload: false });
    }
  }
  window.ldpResult = {
    origin: location.origin,
    served,
    metricsError,
    unsupported,
    fetchErrors: fetchErrors.length,
    fetchErrorSample: fetchErrors.slice(0, 3),
    seconds: (performance.now() - t0) / 1000,
    kept,
    ...totals,
  };
}

main().catch((e) => {
  window.ldpError = String(e && e.stack ? e.stack : e);
});
