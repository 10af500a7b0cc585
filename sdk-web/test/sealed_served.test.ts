// An active collector against the web SDK (docs/SEALED.md, "Pinned keys and sealing"): a real HTTP server
// on 127.0.0.1 serves GET /v1/metrics with a definition of a metric the app's bundled document declares
// sealed, without "sealed": true, or its own analyzer key, and takes every POST /v1/reports. Over 4
// simulated days the client refreshes its definitions and records the metric each day: no report of it
// may reach the collector in plain, and every one is sealed to the key the app pins (the attacker, who
// holds only its own private key, opens none; the analyzer opens all).
import "fake-indexeddb/auto";
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { x25519 } from "@noble/curves/ed25519.js";
import { LocalPolicy, TelemetryClient, readHeader } from "../src/index.js";
import { hex } from "../src/mechanisms/base.js";
import { keyIdOf, openRecord } from "../src/sealing.js";

const DAY = 86_400_000;
const T0 = Date.UTC(2026, 11, 2, 12);
const DAYS = 4;
const BASE = { description: "d", owner: "o@example.org", expires: "2030-12-31", max_reports_per_day: 2 };
const COLOR = { ...BASE, mechanism: { mechanism: "grr", epsilon: 1.0 }, domain: { kind: "dictionary", values: ["red", "green", "blue"], other: true } };
interface Key {
  sk: Uint8Array;
  entry: { key_id: string; public_key: string };
}
function newKey(): Key {
  const sk = x25519.utils.randomSecretKey();
  const pk = x25519.getPublicKey(sk);
  return { sk, entry: { key_id: keyIdOf(pk), public_key: hex(pk) } };
}
const APP_KEY = newKey();
const EVIL_KEY = newKey();

function doc(colorSealed: boolean, keys: Key[] = colorSealed ? [APP_KEY] : []): Record<string, unknown> {
  return {
    format: "ldp-metrics/1",
    ...(keys.length ? { analyzer_keys: keys.map((k) => k.entry) } : {}),
    metrics: { color: colorSealed ? { ...COLOR, sealed: true } : COLOR, tab: { ...COLOR, description: "plain" } },
  };
}

/** How many of the sealed records of `frames` (of `metric`) open with `key`, and how many records there are. */
async function opened(frames: Uint8Array[], metric: string, key: Key): Promise<{ opened: number; records: number; plainFrames: number }> {
  let ok = 0;
  let records = 0;
  let plainFrames = 0;
  for (const f of frames) {
    const h = readHeader(f);
    if (h.metric !== metric) continue;
    if (!h.sealed) {
      plainFrames++;
      continue;
    }
    const start = f.length - 4 - h.nRecords * h.recordSize;
    for (let i = 0; i < h.nRecords; i++) {
      records++;
      try {
        await openRecord(f.subarray(start + i * h.recordSize, start + (i + 1) * h.recordSize), key.sk, metric, h.specId, h.day);
        ok++;
      } catch {
        /* not for this key */
      }
    }
  }
  return { opened: ok, records, plainFrames };
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

function client(url: string, metrics: Record<string, unknown>, name: string, clock: () => number): Promise<TelemetryClient> {
  return TelemetryClient.open({
    collectorUrl: url,
    metrics,
    policy: new LocalPolicy({ perMetricDaily: 10, totalDaily: 20 }),
    storageName: name,
    uploadIntervalMs: 0,
    lifecycle: false,
    clock,
    batchSize: 1,
  });
}

test("a served definition cannot turn a metric the app bundles as sealed into a plain one", async () => {
  const hostile = await hostileCollector(doc(false));
  let now = T0;
  const c = await client(hostile.url, doc(true), "sealed-served", () => now);
  try {
    assert.ok(c.metrics.has("color") && c.metrics.has("tab"), "a bundled sealed metric is recorded (sealed at upload)");
    c.record("color", "green"); // stored before the served definition arrives: it must still leave sealed
    for (let day = 0; day < DAYS; day++) {
      now = T0 + day * DAY;
      await c.refreshMetrics();
      c.record("color", "red");
      c.record("tab", "red");
      await c.flush();
    }
    const metrics = hostile.frames.map((f) => readHeader(f).metric);
    const color = await opened(hostile.frames, "color", APP_KEY);
    assert.equal(color.plainFrames, 0, "no report of the sealed metric reached the collector in plain");
    assert.equal(color.records, 1, "the report stored before the refresh, sealed");
    assert.equal(color.opened, 1, "the analyzer opens it");
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

test("a collector serving its own analyzer key opens no record: they stay sealed to the key the app pins", async () => {
  const hostile = await hostileCollector(doc(true, [EVIL_KEY]));
  let now = T0;
  const c = await client(hostile.url, doc(true), "evil-key", () => now);
  try {
    for (let day = 0; day < DAYS; day++) {
      now = T0 + day * DAY;
      await c.refreshMetrics();
      c.record("color", "red");
      await c.flush();
    }
    const byAttacker = await opened(hostile.frames, "color", EVIL_KEY);
    const byAnalyzer = await opened(hostile.frames, "color", APP_KEY);
    assert.equal(byAttacker.records, DAYS);
    assert.equal(byAttacker.plainFrames, 0);
    assert.equal(byAttacker.opened, 0, "the attacker opens none");
    assert.equal(byAnalyzer.opened, DAYS, "the analyzer opens all");
    assert.equal(c.errors().analyzer_key_refused, 1, "refused once per key");
  } finally {
    await c.close({ upload: false });
    hostile.server.close();
  }
});

test("the served current key is used when the app's bundle names it (rotation)", async () => {
  const NEXT = newKey();
  const hostile = await hostileCollector(doc(true, [NEXT, APP_KEY]));
  const c = await client(hostile.url, doc(true, [APP_KEY, NEXT]), "rotation", () => T0);
  try {
    await c.refreshMetrics();
    c.record("color", "red");
    await c.flush();
    assert.equal((await opened(hostile.frames, "color", NEXT)).opened, 1);
    assert.equal(c.errors().analyzer_key_refused, 0);
  } finally {
    await c.close({ upload: false });
    hostile.server.close();
  }
});

test("a served sealed definition of a bundled plain metric seals it to the served key (no pin: documented)", async () => {
  const hostile = await hostileCollector(doc(true, [EVIL_KEY]));
  const c = await client(hostile.url, doc(false), "served-sealed", () => T0);
  try {
    await c.refreshMetrics();
    assert.ok(c.metrics.get("color")?.sealed);
    c.record("color", "red");
    await c.flush();
    const got = await opened(hostile.frames, "color", EVIL_KEY);
    assert.deepEqual([got.records, got.plainFrames, got.opened], [1, 0, 1]);
    assert.equal(c.errors().unsealing_refused, 0);
  } finally {
    await c.close({ upload: false });
    hostile.server.close();
  }
});
