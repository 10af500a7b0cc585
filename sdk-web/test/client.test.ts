// TelemetryClient against fake-indexeddb and a fake collector (a fetch function).
import "fake-indexeddb/auto";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import {
  ClientConfigError,
  LocalPolicy,
  SimulationSource,
  TelemetryClient,
  decodeFrame,
  makeSpec,
  parseMetrics,
  parseRetryAfter,
  readHeader,
  type ClientOptions,
  type LockManagerLike,
} from "../src/index.js";

const DAY = 86_400_000;
const T0 = Date.UTC(2026, 11, 2, 12);

function metricsDoc(extra: Record<string, unknown> = {}): Record<string, unknown> {
  const base = { description: "d", owner: "o@example.org", expires: "2030-12-31" };
  return {
    format: "ldp-metrics/1",
    metrics: {
      tab: { ...base, mechanism: { mechanism: "grr", epsilon: 1.0 }, domain: { kind: "dictionary", values: ["a", "b", "c"], other: true }, max_reports_per_day: 3 },
      word: { ...base, mechanism: { mechanism: "olh", epsilon: 0.5 }, domain: { kind: "hashed", size: 1024, seed: 0 }, max_reports_per_day: 10 },
      emoji: { ...base, mechanism: { mechanism: "rappor", epsilon: 2.0, num_bits: 16, num_cohorts: 4 }, domain: { kind: "hashed", size: 64, seed: 0 }, max_reports_per_day: 2 },
      minutes: { ...base, kind: "mean", mechanism: { mechanism: "auto", epsilon: 1.0 }, domain: { kind: "range", low: 0, high: 10 }, max_reports_per_day: 1 },
      ...extra,
    },
  };
}

interface Sent {
  url: string;
  frame: Uint8Array;
  headers: Record<string, string>;
  keepalive: boolean;
}

function fakeCollector(answer: (n: number) => Response | Error = () => new Response('{"status":"accepted"}', { status: 202 })): { fetch: typeof fetch; sent: Sent[] } {
  const sent: Sent[] = [];
  const f = async (url: string | URL | Request, init?: RequestInit): Promise<Response> => {
    sent.push({ url: String(url), frame: new Uint8Array(init?.body as Uint8Array), headers: init?.headers as Record<string, string>, keepalive: Boolean(init?.keepalive) });
    const a = answer(sent.length);
    if (a instanceof Error) throw a;
    return a;
  };
  return { fetch: f as typeof fetch, sent };
}

let dbCounter = 0;
function options(over: Partial<ClientOptions> = {}): ClientOptions {
  return {
    collectorUrl: "http://127.0.0.1:9/",
    metrics: metricsDoc(),
    policy: new LocalPolicy({ perMetricDaily: 10, totalDaily: 20 }),
    storageName: `t${++dbCounter}`,
    uploadIntervalMs: 0,
    lifecycle: false,
    clock: () => T0,
    fetch: fakeCollector().fetch,
    ...over,
  };
}

/** A lock manager that locks nothing: the IndexedDB transactions alone must keep the caps. */
const NO_LOCKS: LockManagerLike = { request: (_name, cb) => cb() };

test("record() never throws and counts what it refuses", async () => {
  const c = await TelemetryClient.open(options());
  c.record("nope", "a");
  c.record(42 as unknown as string, "a");
  c.record("tab", { not: "a value" });
  c.record("tab", 1.5);
  c.record("tab", Symbol("x"));
  c.record("minutes", "3"); // a numeric metric takes a number
  c.record("minutes", Number.NaN);
  c.record("minutes", 30); // clamped into [0, 10] (out_of_range: clamp) and recorded
  c.record("tab", "zzz"); // the "other" bucket
  await c.close({ upload: false });
  c.record("tab", "a");
  const e = c.errors();
  assert.equal(e.unknown_metric, 2);
  assert.equal(e.bad_value, 5);
  assert.equal(e.closed, 1);
  assert.equal(c.stats().recorded, 2);
  assert.equal(c.stats().clamped, 1);
  assert.ok(!c.refusedMetrics.has("minutes"));
});

test("the project's metrics/example.json (as text) parses and every metric in it is recordable", () => {
  const doc = readFileSync(new URL("../../metrics/example.json", import.meta.url), "utf8");
  const set = parseMetrics(doc, { rejectExpired: false });
  const names = Object.keys((JSON.parse(doc) as { metrics: Record<string, unknown> }).metrics);
  assert.deepEqual([...set.metrics.keys()].sort(), names.sort());
  assert.equal(set.unsupported.size, 0);
  assert.equal(set.metrics.get("session_minutes")?.spec.name, "hm", "auto picks HM at epsilon 1 (as Python)");
  assert.equal(set.metrics.get("search_word")?.kind, "heavy_hitters");
});

test("a metric this SDK cannot record is refused per metric, never the whole file", async () => {
  const base = { description: "d", owner: "o@example.org", expires: "2030-12-31", max_reports_per_day: 1 };
  const doc = metricsDoc({
    future: { ...base, kind: "mean", mechanism: { mechanism: "quantum_mean", epsilon: 1 }, domain: { kind: "range", low: 0, high: 1 } },
  });
  const c = await TelemetryClient.open(options({ metrics: JSON.stringify(doc) }));
  assert.ok(c.metrics.has("tab") && c.metrics.has("minutes"));
  const why = c.refusedMetrics.get("future") ?? "";
  assert.ok(why.includes('"future"') && why.includes("mean") && why.includes("quantum_mean") && why.includes("update"), why);
  c.record("future", 0.5);
  assert.equal(c.errors().unknown_metric, 1);
  await c.close({ upload: false });
});

test("configuration mistakes fail at construction", () => {
  assert.throws(() => new TelemetryClient(options({ collectorUrl: "ftp://x" })), ClientConfigError);
  assert.throws(() => new TelemetryClient(options({ collectorUrl: "http://example.org" })), /https/);
  assert.throws(() => new TelemetryClient(options({ random: new SimulationSource(1) })), /simulation/);
  assert.throws(() => new TelemetryClient(options({ metrics: { format: "nope" } })), ClientConfigError);
  assert.throws(() => new TelemetryClient(options({ batchSize: 0 })), ClientConfigError);
  assert.doesNotThrow(() => new TelemetryClient(options({ random: new SimulationSource(1), simulation: true })));
});

test("a metric above the local policy is refused, not adopted", async () => {
  const c = await TelemetryClient.open(options({ policy: new LocalPolicy({ perMetricDaily: 10, totalDaily: 20, perMetricOverrides: { tab: 2.9 } }) }));
  assert.ok(!c.metrics.has("tab"), "3 reports of eps 1 exceed a cap of 2.9");
  assert.ok(c.metrics.has("word") && c.metrics.has("emoji"));
  assert.equal(c.errors().metric_refused, 1);
  assert.ok(c.refusedMetrics.get("tab")?.includes("daily cap"));
  c.record("tab", "a");
  assert.equal(c.errors().unknown_metric, 1);
  await c.close({ upload: false });
});

test("the daily report limit and epsilon caps hold, and privacySpent shows them", async () => {
  const c = await TelemetryClient.open(options({ policy: new LocalPolicy({ perMetricDaily: 10, totalDaily: 5 }) }));
  for (let i = 0; i < 6; i++) c.record("tab", "a");
  for (let i = 0; i < 10; i++) c.record("word", `w${i}`);
  await c.flush();
  const s = await c.privacySpent();
  assert.equal(s.metrics.tab?.reports, 3);
  assert.equal(c.stats().sampled_out, 3);
  // total cap 5: tab spent 3, then word 0.5 each: 4 fit
  assert.equal(s.metrics.word?.reports, 4);
  assert.equal(c.stats().over_budget, 6);
  assert.ok(Math.abs(s.spent - 5) < 1e-9 && s.remaining < 1e-9);
  await c.close();
});

test("caps hold across tabs: two clients on one database, racing, no locks", async () => {
  const name = `shared${++dbCounter}`;
  const a = await TelemetryClient.open(options({ storageName: name, locks: NO_LOCKS }));
  const b = await TelemetryClient.open(options({ storageName: name, locks: NO_LOCKS }));
  for (let i = 0; i < 20; i++) {
    a.record("tab", "a");
    b.record("tab", "b");
  }
  await Promise.all([a.flush(), b.flush()]);
  assert.equal((a.stats().recorded ?? 0) + (b.stats().recorded ?? 0), 3, "exactly r = 3 reports in all");
  assert.equal((await a.privacySpent()).metrics.tab?.reports, 3);
  await a.close();
  await b.close();
});

test("a clock set back lands on the latest day seen, whose budget is spent", async () => {
  let now = T0 + DAY;
  const name = `clock${++dbCounter}`;
  const c = await TelemetryClient.open(options({ storageName: name, clock: () => now }));
  for (let i = 0; i < 3; i++) c.record("tab", "a");
  await c.flush();
  now = T0; // one day back
  for (let i = 0; i < 3; i++) c.record("tab", "a");
  await c.flush();
  assert.equal(c.stats().recorded, 3);
  assert.equal(c.stats().sampled_out, 3);
  const back = await c.privacySpent(Math.floor(T0 / DAY));
  assert.deepEqual(back.metrics, {}, "nothing charged to the earlier day");
  await c.close();
  // a restarted client (another tab, later) keeps the rule: the high-water mark is stored
  const d = await TelemetryClient.open(options({ storageName: name, clock: () => T0 }));
  d.record("tab", "a");
  await d.flush();
  assert.equal(d.stats().sampled_out, 1);
  await d.close();
});

test("the outbox keeps its count and byte quotas, dropping the oldest and counting them", async () => {
  const down = fakeCollector(() => new Error("offline"));
  const c = await TelemetryClient.open(options({ maxOutboxReports: 4, fetch: down.fetch }));
  for (let i = 0; i < 7; i++) c.record("word", `w${i}`);
  await c.flush();
  assert.equal(c.errors().outbox_dropped, 3);
  assert.equal(await c.pendingReports(), 4);
  await c.close({ upload: false });
  // OLH records of a 1024-item domain with g = 3 are 5 bytes: 12 bytes hold 2
  const d = await TelemetryClient.open(options({ maxOutboxBytes: 12, fetch: down.fetch }));
  for (let i = 0; i < 5; i++) d.record("word", `w${i}`);
  await d.flush();
  assert.equal(d.errors().outbox_dropped, 3);
  assert.equal(await d.pendingReports(), 2);
  await d.close({ upload: false });
});

test("uploads: binary frames the Python wire format decodes, one batch per (metric, spec, day)", async () => {
  const col = fakeCollector();
  const c = await TelemetryClient.open(options({ fetch: col.fetch, batchSize: 4 }));
  for (let i = 0; i < 3; i++) c.record("tab", "b");
  for (let i = 0; i < 9; i++) c.record("word", `w${i}`);
  c.record("emoji", "😀");
  assert.equal(await c.flush(), true);
  const specs = new Map([...c.metrics.values()].map((m) => [m.spec.specId, m.spec]));
  let reports = 0;
  const ids = new Set<string>();
  for (const s of col.sent) {
    assert.equal(s.url, "http://127.0.0.1:9/v1/reports");
    assert.equal(s.headers["Content-Type"], "application/vnd.ldp.frame");
    const batch = decodeFrame(s.frame, specs);
    assert.equal(s.headers["Idempotency-Key"], readHeader(s.frame).batchId.reduce((a, x) => a + x.toString(16).padStart(2, "0"), ""));
    assert.equal(batch.day, Math.floor(T0 / DAY));
    ids.add(s.headers["Idempotency-Key"] as string);
    reports += batch.records.length / batch.spec.recordSize;
  }
  assert.equal(reports, 13);
  assert.equal(col.sent.length, 5, "tab: 1 batch; word: 4 + 4 + 1; emoji: 1");
  assert.equal(ids.size, col.sent.length, "every batch has its own id");
  assert.equal(c.stats().uploaded_reports, 13);
  await c.close();
});

test("a 4xx drops the batch and counts it; a 408/429/5xx keeps it for a retry", async () => {
  const answers = [400, 503, 202];
  const col = fakeCollector((n) => new Response("{}", { status: answers[n - 1] ?? 202, headers: { "Retry-After": "0" } }));
  const c = await TelemetryClient.open(options({ fetch: col.fetch, batchSize: 1 }));
  c.record("tab", "a");
  c.record("word", "x");
  await c.flush();
  assert.equal(c.errors().upload_rejected_batches, 1);
  assert.equal(c.errors().upload_rejected_reports, 1);
  assert.equal(c.errors().upload_failures, 1);
  assert.equal(await c.pendingReports(), 1);
  await c.flush(); // Retry-After: 0 lets it go at once
  assert.equal(col.sent.length, 3);
  assert.deepEqual(col.sent[2]?.frame, col.sent[1]?.frame, "the retry resends the identical frame");
  assert.equal(await c.pendingReports(), 0);
  await c.close();
});

test("batch ids are persisted before the first attempt: a restarted client resends the same bytes", async () => {
  const name = `restart${++dbCounter}`;
  const down = fakeCollector(() => new Error("connection reset"));
  const a = await TelemetryClient.open(options({ storageName: name, fetch: down.fetch }));
  for (let i = 0; i < 3; i++) a.record("word", `w${i}`);
  assert.equal(await a.flush(), false);
  await a.close({ upload: false });
  assert.equal(down.sent.length, 1);
  const up = fakeCollector();
  const b = await TelemetryClient.open(options({ storageName: name, fetch: up.fetch, backoffBaseMs: 1, backoffMaxMs: 1, clock: () => T0 + 10_000 }));
  assert.equal(await b.flush(), true);
  assert.equal(up.sent.length, 1);
  assert.deepEqual(up.sent[0]?.frame, down.sent[0]?.frame);
  assert.equal(up.sent[0]?.headers["Idempotency-Key"], down.sent[0]?.headers["Idempotency-Key"]);
  await b.close();
});

test("backoff: full jitter below base * 2^k, Retry-After honoured plus at most 10 %", async () => {
  const c = new TelemetryClient(options({ random: new SimulationSource(3), simulation: true, backoffBaseMs: 1000, backoffMaxMs: 60_000 }));
  const draws = Array.from({ length: 2000 }, () => c.backoffDelay(3, null));
  assert.ok(draws.every((d) => d >= 0 && d < 8000));
  // uniform on [0, 8000): the mean is 4000 with standard error 8000/sqrt(12 * 2000) ≈ 52
  const mean = draws.reduce((a, b) => a + b, 0) / draws.length;
  assert.ok(Math.abs(mean - 4000) < 4.5 * 52, `mean ${mean}`);
  assert.ok(c.backoffDelay(50, null) <= 60_000);
  for (let i = 0; i < 100; i++) {
    const d = c.backoffDelay(1, 30);
    assert.ok(d >= 30_000 && d <= 33_000);
  }
  assert.equal(parseRetryAfter("120", 0), 120);
  assert.equal(parseRetryAfter(new Date(T0 + 5000).toUTCString(), T0), 5);
  assert.equal(parseRetryAfter("soon", 0), null);
  await c.close({ upload: false });
});

test("a Retry-After on 503 holds uploads back at least that long", async () => {
  let now = T0;
  const col = fakeCollector((n) => (n === 1 ? new Response("{}", { status: 503, headers: { "Retry-After": "60" } }) : new Response("{}", { status: 202 })));
  const c = await TelemetryClient.open(options({ fetch: col.fetch, clock: () => now }));
  c.record("tab", "a");
  await c.flush();
  now += 59_000;
  await c.flush();
  assert.equal(col.sent.length, 1, "not before 60 s");
  now += 8_000;
  assert.equal(await c.flush(), true);
  assert.equal(col.sent.length, 2);
  await c.close();
});

test("page hide: formed batches go by sendBeacon, falling back to fetch with keepalive", async () => {
  const down = fakeCollector(() => new Error("offline"));
  const beacons: Blob[] = [];
  let accept = true;
  const c = await TelemetryClient.open(options({ fetch: down.fetch, sendBeacon: (_u, blob) => (beacons.push(blob), accept) }));
  c.record("tab", "a");
  await c.flush(); // forms the batch (and fails to send it)
  c.beaconFlush();
  assert.equal(beacons.length, 1);
  assert.equal(beacons[0]?.type, "application/vnd.ldp.frame");
  assert.deepEqual(new Uint8Array(await beacons[0]!.arrayBuffer()), down.sent[0]?.frame);
  accept = false;
  const before = down.sent.length;
  c.beaconFlush();
  await new Promise((r) => setTimeout(r, 10));
  assert.ok(down.sent.slice(before).some((s) => s.keepalive), "fell back to fetch with keepalive");
  assert.equal(await c.pendingReports(), 1, "kept until an upload is answered");
  await c.close({ upload: false });
});

test("a RAPPOR metric is pinned to its first definition", async () => {
  const name = `pin${++dbCounter}`;
  const a = await TelemetryClient.open(options({ storageName: name }));
  a.record("emoji", "x");
  await a.flush();
  await a.close();
  const changed = metricsDoc({ emoji: { description: "d", owner: "o@example.org", expires: "2030-12-31", mechanism: { mechanism: "rappor", epsilon: 2.0, num_bits: 16, num_cohorts: 4, hash_seed: 1 }, domain: { kind: "hashed", size: 64, seed: 0 }, max_reports_per_day: 2 } });
  const b = await TelemetryClient.open(options({ storageName: name, metrics: changed, clock: () => T0 + DAY }));
  b.record("emoji", "x");
  await b.flush();
  assert.equal(b.errors().pin_conflict, 1);
  assert.equal(b.stats().recorded, 0);
  await b.close();
});

test("simulation mode reproduces reports from a seed", async () => {
  const frames: Uint8Array[][] = [];
  for (let run = 0; run < 2; run++) {
    const col = fakeCollector();
    const c = await TelemetryClient.open(options({ fetch: col.fetch, random: new SimulationSource(42), simulation: true }));
    for (let i = 0; i < 3; i++) c.record("word", `w${i}`);
    await c.close();
    frames.push(col.sent.map((s) => s.frame));
  }
  assert.deepEqual(frames[0], frames[1]);
  assert.equal(readHeader(frames[0]![0]!).specId, makeSpec("olh", { epsilon: 0.5, domain_size: 1024 }).specId);
});
