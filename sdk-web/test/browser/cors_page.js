// The CORS test's page program (plain JavaScript, served as is by test/browser/cors.ts): a page on its own
// origin reads the metrics from the collector at another origin and uploads to it.
import * as ldp from "./ldp-telemetry.min.js";

async function main() {
  const collector = new URLSearchParams(location.search).get("collector");
  let metricsError = null;
  let metrics = null;
  try {
    metrics = await ldp.fetchMetrics(collector);
  } catch (e) {
    metricsError = String(e);
  }
  // without the metrics (refused cross-origin) the page falls back on a copy it ships, as an app may
  if (metrics === null) metrics = JSON.parse(new URLSearchParams(location.search).get("metrics"));
  const policy = new ldp.LocalPolicy({ perMetricDaily: 20, totalDaily: 100 });
  const fetchErrors = [];
  const watched = (url, init) =>
    fetch(url, init).catch((e) => {
      fetchErrors.push(String(e));
      throw e;
    });
  const client = await ldp.TelemetryClient.open({ collectorUrl: collector, metrics, policy, storageName: "cors", uploadIntervalMs: 0, fetch: watched, backoffBaseMs: 1, backoffMaxMs: 1 });
  for (const v of ["a", "b", "c", "a"]) client.record("tab", v);
  const flushed = await client.flush();
  window.ldpResult = { origin: location.origin, flushed, metricsError, fetchErrors, stats: client.stats(), errors: client.errors(), pending: await client.pendingReports() };
  await client.close({ upload: false });
}

main().catch((e) => {
  window.ldpError = String(e && e.stack ? e.stack : e);
});
