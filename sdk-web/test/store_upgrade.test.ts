// The database of SDK 0.1 (version 1: no `tokens` store) is upgraded in place: its stored reports are
// kept and uploaded by the new client, and the upgrade waits for (rather than fails on) an open version-1
// connection, which a newer tab then gets to close.
import { IDBFactory } from "fake-indexeddb";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { LocalPolicy, TelemetryClient, makeSpec } from "../src/index.js";
import { DB_VERSION } from "../src/store.js";

const base = { description: "d", owner: "o@example.org", expires: "2030-12-31" };
const METRICS = { format: "ldp-metrics/1", metrics: { tab: { ...base, mechanism: { mechanism: "grr", epsilon: 1.0 }, domain: { kind: "dictionary", values: ["a", "b", "c"] }, max_reports_per_day: 10 } } };

function openV1(factory: IDBFactory, name: string): Promise<IDBDatabase> {
  return new Promise((resolve, reject) => {
    const r = factory.open(name, 1);
    r.onupgradeneeded = () => {
      const db = r.result;
      db.createObjectStore("meta");
      db.createObjectStore("ledger", { keyPath: "day" });
      db.createObjectStore("outbox", { autoIncrement: true });
      db.createObjectStore("batches", { keyPath: "id" });
    };
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error);
  });
}

test("a version-1 database keeps its reports through the upgrade, even with a version-1 tab still open", async () => {
  assert.equal(DB_VERSION, 2);
  const factory = new IDBFactory();
  const old = await openV1(factory, "upgrade");
  const spec = makeSpec("grr", { epsilon: 1.0, domain_size: 3 });
  await new Promise<void>((resolve, reject) => {
    const tx = old.transaction(["meta", "outbox"], "readwrite");
    tx.objectStore("outbox").add({ metric: "tab", specId: spec.specId, spec: spec.toDict(), day: 20_000, record: Uint8Array.of(2), enqueued: 0 });
    tx.objectStore("meta").put(1, "outbox_reports");
    tx.objectStore("meta").put(1, "outbox_bytes");
    tx.oncomplete = () => resolve();
    tx.onerror = () => reject(tx.error);
  });
  // old stays open, like a tab of SDK 0.1 (whose database has no versionchange handler)
  const frames: number[] = [];
  const server = createServer((req, res) => {
    req.on("data", () => undefined);
    req.on("end", () => {
      frames.push(1);
      res.writeHead(202, { "content-type": "application/json" }).end('{"status":"accepted"}');
    });
  });
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  const c = new TelemetryClient({
    collectorUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    metrics: METRICS,
    policy: new LocalPolicy({ perMetricDaily: 5, totalDaily: 5 }),
    indexedDB: factory,
    storageName: "upgrade",
    uploadIntervalMs: 0,
    lifecycle: false,
  });
  try {
    const opened = await Promise.race([c.ready.then(() => "open"), new Promise((r) => setTimeout(() => r("waiting"), 200))]);
    assert.equal(opened, "waiting", "the upgrade waits while the version-1 connection is open");
    old.close(); // the old tab goes away
    await c.ready;
    const r = await c.flushResult();
    assert.deepEqual([r.ok, r.sent.reports, r.queued], [true, 1, 0], "the stored report survived the upgrade");
    assert.equal(frames.length, 1);
  } finally {
    await c.close({ upload: false });
    server.close();
  }
});
