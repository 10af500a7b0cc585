// An active collector against the web SDK (docs/SEALED.md, "Pinned keys and sealing"): a real HTTP server
// on 127.0.0.1 serves GET /v1/metrics with a definition of a metric the app's bundled document declares
// sealed, without "sealed": true, and takes every POST /v1/reports. Over 4 simulated days the client
// refreshes its definitions and records the metric each day: no report of it may reach the collector
// (the web SDK cannot seal, so a sealed metric is never recorded here, whatever the collector serves).
import "fake-indexeddb/auto";
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { LocalPolicy, TelemetryClient, readHeader } from "../src/index.js";

const DAY = 86_400_000;
const T0 = Date.UTC(2026, 11, 2, 12);
const DAYS = 4;
const BASE = { description: "d", owner: "o@example.org", expires: "2030-12-31", max_reports_per_day: 2 };
const COLOR = { ...BASE, mechanism: { mechanism: "grr", epsilon: 1.0 }, domain: { kind: "dictionary", values: ["red", "green", "blue"], other: true } };
/** The web SDK does not read analyzer keys (it never seals); the documents name none. */
function doc(colorSealed: boolean): Record<string, unknown> {
  return {
    format: "ldp-metrics/1",
    metrics: { color: colorSealed ? { ...COLOR, sealed: true } : COLOR, tab: { ...COLOR, description: "plain" } },
  };
}

/** The hostile collector: serves `served` and keeps every uploaded frame. */
async function hostileCollector(served: Record<string, unknown>): Promise<{ url: string; frames: Uint8Array[]; server: Server }> {
  const frames: Uint8Array[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      if (req.method === "GET" && req.url === "/v1/metrics") {
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(served));
      } else if (req.method === "POST" && req.url === "/v1/reports") {
        frames.push(new Uint8Array(Buffer.concat(chunks)));
        res.writeHead(202, { "content-type": "application/json" }).end('{"status":"accepted"}');
      } else res.writeHead(404).end();
    });
  });
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, frames, server };
}

test("a served definition cannot turn a metric the app bundles as sealed into a plain one", async () => {
  const hostile = await hostileCollector(doc(false));
  let now = T0;
  const c = await TelemetryClient.open({
    collectorUrl: hostile.url,
    metrics: doc(true),
    policy: new LocalPolicy({ perMetricDaily: 10, totalDaily: 20 }),
    storageName: "sealed-served",
    uploadIntervalMs: 0,
    lifecycle: false,
    clock: () => now,
    batchSize: 1,
  });
  try {
    assert.ok(!c.metrics.has("color") && c.metrics.has("tab"), "a bundled sealed metric is not recorded here");
    for (let day = 0; day < DAYS; day++) {
      now = T0 + day * DAY;
      await c.refreshMetrics();
      c.record("color", "red");
      c.record("tab", "red");
      await c.flush();
    }
    const metrics = hostile.frames.map((f) => readHeader(f).metric);
    assert.equal(metrics.filter((m) => m === "color").length, 0, "no report of the sealed metric reached the collector");
    assert.equal(metrics.filter((m) => m === "tab").length, DAYS, "the plain metric's served definition was adopted and uploaded");
    assert.equal(c.errors().unsealing_refused, 1, "refused once (the same definition served 4 times)");
    assert.equal(c.errors().metric_refused, 1);
    assert.equal(c.errors().unknown_metric, DAYS);
    assert.match(c.refusedMetrics.get("color") ?? "", /sealed/);
  } finally {
    await c.close({ upload: false });
    hostile.server.close();
  }
});

test("a served sealed definition stops a bundled plain metric here (the web SDK does not seal)", async () => {
  const hostile = await hostileCollector(doc(true));
  const c = await TelemetryClient.open({
    collectorUrl: hostile.url,
    metrics: doc(false),
    policy: new LocalPolicy({ perMetricDaily: 10, totalDaily: 20 }),
    storageName: "served-sealed",
    uploadIntervalMs: 0,
    lifecycle: false,
    clock: () => T0,
  });
  try {
    assert.ok(c.metrics.has("color"));
    await c.refreshMetrics();
    assert.ok(!c.metrics.has("color"));
    c.record("color", "red");
    await c.flush();
    assert.equal(hostile.frames.filter((f) => readHeader(f).metric === "color").length, 0);
    assert.equal(c.errors().unsealing_refused, 0);
  } finally {
    await c.close({ upload: false });
    hostile.server.close();
  }
});
