// Day rules of the web token wallet (docs/TOKENS.md, "The web SDK"): a batch of day D is paid only with a
// token of D, which exists while D is today or yesterday. A batch stored longer (the device offline) is
// dropped, counted as refused with the reason token_expired; a batch of yesterday is kept and waits for a
// token of yesterday. No server is needed: both happen before any token request (the URLs are closed ports).
import "fake-indexeddb/auto";
import assert from "node:assert/strict";
import { test } from "node:test";
import { ed25519 } from "@noble/curves/ed25519.js";
import { LocalPolicy, TelemetryClient } from "../src/index.js";
import { b64 } from "../src/tokens.js";

const DAY = 86_400_000;
const T0 = Date.UTC(2026, 11, 6, 12);
const base = { description: "d", owner: "o@example.org", expires: "2030-12-31" };
const METRICS = { format: "ldp-metrics/1", metrics: { tab: { ...base, mechanism: { mechanism: "grr", epsilon: 1.0 }, domain: { kind: "dictionary", values: ["a", "b"] }, max_reports_per_day: 10 } } };

function bundle(): string {
  const sk = crypto.getRandomValues(new Uint8Array(32));
  const credential = { v: 1, device_id: "dev-days", public_key: b64(ed25519.getPublicKey(sk)), issued_at: 0, expires_at: 2 ** 31, authority: "0".repeat(16), signature: b64(new Uint8Array(64)) };
  return JSON.stringify({ kind: "ldp-device-identity", v: 1, private_key: b64(sk), credential, authority_key: b64(new Uint8Array(32)) });
}

async function client(name: string, now: () => number, tokens: boolean): Promise<TelemetryClient> {
  return TelemetryClient.open({
    collectorUrl: "http://127.0.0.1:9",
    metrics: METRICS,
    policy: new LocalPolicy({ perMetricDaily: 10, totalDaily: 10 }),
    storageName: name,
    uploadIntervalMs: 0,
    lifecycle: false,
    batchSize: 1,
    clock: now,
    backoffBaseMs: 1,
    backoffMaxMs: 2,
    ...(tokens ? { tokens: { issuerUrl: "http://127.0.0.1:9", device: bundle(), origin: "c" } } : {}),
  });
}

test("a batch older than yesterday is dropped with token_expired; yesterday's waits for a token", async () => {
  let now = T0;
  const offline = await client("days", () => now, false);
  offline.record("tab", "a");
  assert.equal((await offline.flushResult()).waiting?.reason, "transient", "stored on day 0 (nobody listens on port 9)");
  now = T0 + DAY;
  offline.record("tab", "b");
  await offline.close({ upload: false });
  now = T0 + 2 * DAY; // day 0's batch is two days old, day 1's is yesterday's
  const c = await client("days", () => now, true);
  try {
    const r = await c.flushResult();
    assert.deepEqual(r.refused, { batches: 1, reports: 1 }, "day 0 can no longer be paid");
    assert.equal(r.rejection?.error, "token_expired");
    assert.match(r.rejection?.message ?? "", /can no longer be paid/);
    assert.equal(r.queued, 1, "yesterday's report is kept");
    assert.equal(r.waiting?.reason, "no_token");
    assert.match(r.waiting?.message ?? "", /2026-12-07/);
    assert.equal(c.errors().tokens_exhausted, 1);
  } finally {
    await c.close({ upload: false });
  }
});

test("a tokens option without a usable device bundle is refused at construction, saying what to pass", async () => {
  await assert.rejects(
    TelemetryClient.open({
      collectorUrl: "http://127.0.0.1:9",
      metrics: METRICS,
      policy: new LocalPolicy({ perMetricDaily: 1, totalDaily: 1 }),
      storageName: "bad-device",
      uploadIntervalMs: 0,
      lifecycle: false,
      tokens: { issuerUrl: "http://127.0.0.1:9", device: "{}", origin: "c" },
    }),
    /^ClientConfigError: tokens\.device: not an enrolled device bundle .*ldp issuer enroll/,
  );
});
