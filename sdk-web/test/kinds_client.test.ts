// The client records every kind of metrics/example.json and more: frames decode under the metric's spec,
// memoized state (dBitFlip, 1BitMean, LOLOHA, PEM's level) is durable across reloads (the device secret
// lives in IndexedDB), and a memoized metric's definition is pinned.
import "fake-indexeddb/auto";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { LocalPolicy, TelemetryClient, decodeFrame, readHeader, type ClientOptions, type MetricDefinition } from "../src/index.js";

const T0 = Date.UTC(2026, 11, 2, 12);
const base = { description: "d", owner: "o@example.org", expires: "2030-12-31" };

function doc(extra: Record<string, unknown> = {}): Record<string, unknown> {
  const example = JSON.parse(readFileSync(new URL("../../metrics/example.json", import.meta.url), "utf8"));
  return {
    format: "ldp-metrics/1",
    metrics: {
      ...example.metrics,
      counter_db: { ...base, kind: "distribution", mechanism: { mechanism: "dbitflip", epsilon: 1.0, buckets: 16, sample: 4 }, domain: { kind: "range", low: 0, high: 100 }, max_reports_per_day: 1 },
      counter_1b: { ...base, kind: "mean", mechanism: { mechanism: "1bitmean", epsilon: 1.0, granularity: 8 }, domain: { kind: "range", low: 0, high: 100 }, max_reports_per_day: 1 },
      choice_ll: { ...base, mechanism: { mechanism: "loloha", epsilon: 2.0 }, domain: { kind: "dictionary", values: ["a", "b", "c", "d"] }, max_reports_per_day: 1 },
      word_sfp: { ...base, kind: "heavy_hitters", mechanism: { mechanism: "sfp", epsilon: 2.0, num_hashes: 16, width: 64 }, domain: { kind: "string", length: 8 }, max_reports_per_day: 1 },
      pos_pm: { ...base, kind: "mean", mechanism: { mechanism: "pm", epsilon: 4.0, dims: 3, sample: 1 }, domain: { kind: "range", low: -1, high: 1 }, max_reports_per_day: 1 },
      ...extra,
    },
  };
}

function collector(): { fetch: typeof fetch; frames: Uint8Array[] } {
  const frames: Uint8Array[] = [];
  const f = async (_url: string | URL | Request, init?: RequestInit): Promise<Response> => {
    frames.push(new Uint8Array(init?.body as Uint8Array));
    return new Response('{"status":"accepted"}', { status: 202 });
  };
  return { fetch: f as typeof fetch, frames };
}

let n = 0;
function options(over: Partial<ClientOptions>): ClientOptions {
  return {
    collectorUrl: "http://127.0.0.1:9/",
    metrics: doc(),
    policy: new LocalPolicy({ perMetricDaily: 10, totalDaily: 100 }),
    storageName: `kinds${++n}`,
    uploadIntervalMs: 0,
    lifecycle: false,
    clock: () => T0,
    ...over,
  };
}

const VALUES: Record<string, unknown> = {
  emoji_used: "😀",
  settings_tab: "privacy",
  dark_mode: "on",
  search_word: "weather",
  session_minutes: 42.5,
  session_minutes_distribution: 300, // clamped to 240
  counter_db: 37,
  counter_1b: 61,
  choice_ll: "c",
  word_sfp: "news",
  pos_pm: [0.5, -0.25, 1],
};

async function recordAll(storageName: string, day: number): Promise<Map<string, Uint8Array>> {
  const c0 = collector();
  const c = await TelemetryClient.open(options({ storageName, fetch: c0.fetch, clock: () => T0 + day * 86_400_000 }));
  for (const [name, v] of Object.entries(VALUES)) c.record(name, v);
  assert.equal(await c.flush(), true);
  assert.equal(c.stats().recorded, Object.keys(VALUES).length, JSON.stringify(c.errors()));
  assert.equal(c.stats().clamped, 1);
  const out = new Map<string, Uint8Array>();
  for (const f of c0.frames) {
    const h = readHeader(f);
    const m = c.metrics.get(h.metric) as MetricDefinition;
    const batch = decodeFrame(f, m.spec);
    assert.equal(batch.records.length, m.spec.recordSize);
    out.set(h.metric, batch.records);
  }
  await c.close();
  return out;
}

test("every kind of metrics/example.json (and the repeated ones) is recorded and uploaded as decodable frames", async () => {
  const got = await recordAll("kinds-a", 0);
  assert.deepEqual([...got.keys()].sort(), Object.keys(VALUES).sort());
});

test("memoized reports are durable: after a reload (same IndexedDB store) the same value gives the same bytes", async () => {
  const first = await recordAll("kinds-b", 0);
  const again = await recordAll("kinds-b", 1); // the next day, a new client on the same store
  for (const name of ["counter_db", "counter_1b"]) assert.equal(Buffer.from(again.get(name)!).toString("hex"), Buffer.from(first.get(name)!).toString("hex"), name);
  // LOLOHA keeps its seed (the first 4 bytes) for life; PEM keeps its level (the first byte)
  assert.deepEqual(again.get("choice_ll")!.subarray(0, 4), first.get("choice_ll")!.subarray(0, 4));
  assert.equal(again.get("search_word")![0], first.get("search_word")![0]);
  const other = await recordAll("kinds-c", 0); // another device: another seed (2^-32 to collide)
  assert.notDeepEqual(other.get("choice_ll")!.subarray(0, 4), first.get("choice_ll")!.subarray(0, 4));
});

test("a memoized numeric metric is pinned: a later, different definition is dropped (pin_conflict)", async () => {
  const storageName = "kinds-pin";
  const c1 = await TelemetryClient.open(options({ storageName, fetch: collector().fetch }));
  c1.record("counter_db", 10);
  await c1.close({ upload: false });
  const changed = doc({ counter_db: { ...base, kind: "distribution", mechanism: { mechanism: "dbitflip", epsilon: 1.0, buckets: 16, sample: 5 }, domain: { kind: "range", low: 0, high: 100 }, max_reports_per_day: 1 } });
  const c2 = await TelemetryClient.open(options({ storageName, metrics: changed, fetch: collector().fetch, clock: () => T0 + 86_400_000 }));
  c2.record("counter_db", 10);
  await c2.close({ upload: false });
  assert.equal(c2.errors().pin_conflict, 1);
  assert.equal(c2.stats().recorded, 0);
});

test("the local policy bounds the repeated mechanisms as Python's does", async () => {
  const big = doc({ wide: { ...base, mechanism: { mechanism: "loloha", epsilon: 1.0, g: 65 }, domain: { kind: "hashed", size: 1000 }, max_reports_per_day: 1 } });
  const c = await TelemetryClient.open(options({ metrics: big, fetch: collector().fetch }));
  assert.match(c.refusedMetrics.get("wide") ?? "", /g 65 is above 64/);
  assert.ok(c.metrics.has("choice_ll"));
  await c.close({ upload: false });
});
