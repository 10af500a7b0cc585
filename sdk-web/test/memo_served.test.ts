// An active collector against memoized numeric and frequency metrics (dBitFlip, LOLOHA): a real HTTP server on
// 127.0.0.1 serves GET /v1/metrics with a new definition of each every day (dBitFlip's `sample`, LOLOHA's `g`:
// each within the local policy), hoping for a fresh memoized response of the same value each day; enough fresh
// ones reveal the value as surely as fresh reports. The client pins a memoized metric's definition on its first
// report (as Python's client_sdk.memo.definition_pin): later definitions are dropped (`pin_conflict`), so the
// collector gets the one memoized response and nothing more.
import "fake-indexeddb/auto";
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { LocalPolicy, TelemetryClient, hex, readHeader } from "../src/index.js";

const DAY = 86_400_000;
const T0 = Date.UTC(2026, 11, 2, 12);
const DAYS = 4;
const BASE = { description: "d", owner: "o@example.org", expires: "2030-12-31", max_reports_per_day: 1 };

function doc(day: number): Record<string, unknown> {
  return {
    format: "ldp-metrics/1",
    metrics: {
      counter: { ...BASE, kind: "distribution", mechanism: { mechanism: "dbitflip", epsilon: 1.0, buckets: 16, sample: 2 + day }, domain: { kind: "range", low: 0, high: 100 } },
      choice: { ...BASE, mechanism: { mechanism: "loloha", epsilon: 2.0, g: 3 + day }, domain: { kind: "dictionary", values: ["a", "b", "c", "d"] } },
    },
  };
}

async function hostileCollector(): Promise<{ url: string; frames: Uint8Array[]; server: Server; day: { n: number } }> {
  const frames: Uint8Array[] = [];
  const day = { n: 0 };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      if (req.method === "GET" && req.url === "/v1/metrics") res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(doc(day.n)));
      else if (req.method === "POST" && req.url === "/v1/reports") {
        frames.push(new Uint8Array(Buffer.concat(chunks)));
        res.writeHead(202, { "content-type": "application/json" }).end('{"status":"accepted"}');
      } else res.writeHead(404).end();
    });
  });
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, frames, server, day };
}

test("a collector re-serving memoized definitions daily gets one memoized response per value, not one a day", async () => {
  const hostile = await hostileCollector();
  let now = T0;
  const c = await TelemetryClient.open({
    collectorUrl: hostile.url,
    metrics: doc(0),
    policy: new LocalPolicy({ perMetricDaily: 10, totalDaily: 20 }),
    storageName: "memo-served",
    uploadIntervalMs: 0,
    lifecycle: false,
    clock: () => now,
  });
  try {
    for (let day = 0; day < DAYS; day++) {
      now = T0 + day * DAY;
      hostile.day.n = day;
      await c.refreshMetrics();
      c.record("counter", 42);
      c.record("choice", "c");
      await c.flush();
    }
    const got = new Map<string, Set<string>>();
    for (const f of hostile.frames) {
      const h = readHeader(f);
      const recs = got.get(h.metric) ?? new Set<string>();
      const body = f.subarray(44 + h.metric.length, f.length - 4);
      for (let i = 0; i < h.nRecords; i++) recs.add(`${h.specId}:${hex(body.subarray(i * h.recordSize, (i + 1) * h.recordSize))}`);
      got.set(h.metric, recs);
    }
    assert.equal(got.get("counter")?.size, 1, `distinct dBitFlip responses: ${[...(got.get("counter") ?? [])].join(" ")}`);
    assert.equal(got.get("choice")?.size, 1, "LOLOHA: one report, under the pinned definition");
    assert.equal(c.errors().pin_conflict, 2 * (DAYS - 1));
  } finally {
    await c.close({ upload: false });
    hostile.server.close();
  }
});
