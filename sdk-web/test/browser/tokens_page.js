// The token test's page program (plain JavaScript, served as is by test/browser/tokens.ts).
import * as ldp from "./ldp-telemetry.min.js";

async function main() {
  const cfg = await (await fetch("./config.json")).json();
  const metrics = await ldp.fetchMetrics(cfg.collectorUrl);
  const client = await ldp.TelemetryClient.open({
    collectorUrl: cfg.collectorUrl,
    metrics,
    policy: new ldp.LocalPolicy({ perMetricDaily: 20, totalDaily: 20 }),
    storageName: "tokens-page",
    uploadIntervalMs: 0,
    batchSize: 1,
    tokens: { issuerUrl: cfg.issuerUrl, device: cfg.device, origin: cfg.origin, stock: 3 },
  });
  const flushes = [];
  for (const v of ["a", "b", "c"]) {
    client.record("m", v);
    flushes.push(await client.flushResult());
  }
  window.ldpResult = { flushes, errors: client.errors(), stats: client.stats(), pending: await client.pendingReports() };
  await client.close({ upload: false });
}

main().catch((e) => {
  window.ldpError = `${e && e.name}: ${e && e.message}\n${e && e.stack}`;
});
