// End-to-end driver, run by tests/web/test_web_e2e.py: many devices, each a TelemetryClient with its
// own IndexedDB (fake-indexeddb) reading GET /v1/metrics, record their values and upload to the real
// collector. Then a fraction of the uploaded frames is sent again (what a page-hide beacon followed
// by a retry does): the collector must count each batch once.
// argv[2]: a JSON file {collectorUrl, devices: [{metric: [values...]}], resendEvery}; stdout: a JSON summary.
import { IDBFactory } from "fake-indexeddb";
import { readFileSync } from "node:fs";
import { LocalPolicy, TelemetryClient, fetchMetrics } from "../../src/index.js";

interface Plan {
  collectorUrl: string;
  devices: Record<string, (string | number)[]>[];
  resendEvery: number;
}

const plan = JSON.parse(readFileSync(process.argv[2] as string, "utf8")) as Plan;
const metrics = await fetchMetrics(plan.collectorUrl);
const policy = new LocalPolicy({ perMetricDaily: 20, totalDaily: 200 });
const frames: { body: Uint8Array; headers: Record<string, string> }[] = [];
const recordingFetch = (async (url: string | URL | Request, init?: RequestInit) => {
  if (init?.body instanceof Uint8Array) frames.push({ body: init.body, headers: init.headers as Record<string, string> });
  return fetch(url, init);
}) as typeof fetch;

const errors: Record<string, number> = {};
const stats: Record<string, number> = {};
let leftover = 0;
const concurrency = 8;
let next = 0;
async function worker(): Promise<void> {
  for (;;) {
    const i = next++;
    if (i >= plan.devices.length) return;
    const client = await TelemetryClient.open({
      collectorUrl: plan.collectorUrl,
      metrics,
      policy,
      indexedDB: new IDBFactory(),
      fetch: recordingFetch,
      uploadIntervalMs: 0,
      lifecycle: false,
    });
    for (const [metric, values] of Object.entries(plan.devices[i] as Record<string, (string | number)[]>)) for (const v of values) client.record(metric, v);
    await client.close();
    leftover += await client.pendingReports().catch(() => 0);
    for (const [k, v] of Object.entries(client.errors())) errors[k] = (errors[k] ?? 0) + v;
    for (const [k, v] of Object.entries(client.stats())) stats[k] = (stats[k] ?? 0) + v;
  }
}
await Promise.all(Array.from({ length: concurrency }, worker));

let resent = 0;
const statuses: number[] = [];
for (let i = 0; i < frames.length; i += plan.resendEvery) {
  const f = frames[i] as { body: Uint8Array; headers: Record<string, string> };
  const r = await fetch(plan.collectorUrl + "/v1/reports", { method: "POST", body: f.body as BodyInit, headers: f.headers });
  statuses.push(r.status);
  await r.arrayBuffer();
  resent++;
}
process.stdout.write(JSON.stringify({ errors, stats, leftover, frames: frames.length, resent, resentStatuses: statuses, refused: Object.fromEntries(metrics.unsupported) }));
