// No silent loss: a collector that refuses uploads makes flush() resolve false and flushResult() say what
// happened. A 401 token_missing (`ldp collector --require-tokens`, and this client has no token issuer) keeps
// the reports and says what to do; any other 4xx drops the batch, counted. The collector here is a real node HTTP server on 127.0.0.1 answering as the Python one
// does (collector/tokens.py: {"error": "token_missing", "message": ...}); the client uses Node's own fetch.
import "fake-indexeddb/auto";
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server } from "node:http";
import { after, before, test } from "node:test";
import { LocalPolicy, TOKENS_REQUIRED_MESSAGE, TelemetryClient, type ClientOptions } from "../src/index.js";

const PORT = 20196;
const base = { description: "d", owner: "o@example.org", expires: "2030-12-31" };
const METRICS = {
  format: "ldp-metrics/1",
  metrics: { tab: { ...base, mechanism: { mechanism: "grr", epsilon: 1.0 }, domain: { kind: "dictionary", values: ["a", "b", "c"] }, max_reports_per_day: 10 } },
};

let answer: { status: number; body: string } = { status: 202, body: '{"status":"accepted"}' };
const seen: { path: string; headers: IncomingMessage["headers"]; bytes: number }[] = [];
let server: Server;

before(async () => {
  server = createServer((request, response) => {
    let bytes = 0;
    request.on("data", (chunk: Buffer) => (bytes += chunk.length));
    request.on("end", () => {
      seen.push({ path: request.url ?? "", headers: request.headers, bytes });
      response.writeHead(answer.status, { "Content-Type": "application/json" });
      response.end(answer.body);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(PORT, "127.0.0.1", resolve);
  });
});
after(() => new Promise<void>((resolve) => server.close(() => resolve())));

let n = 0;
function options(over: Partial<ClientOptions> = {}): ClientOptions {
  return {
    collectorUrl: `http://127.0.0.1:${PORT}`,
    metrics: METRICS,
    policy: new LocalPolicy({ perMetricDaily: 10, totalDaily: 20 }),
    storageName: `refused-${++n}`,
    uploadIntervalMs: 0,
    lifecycle: false,
    batchSize: 1,
    ...over,
  };
}

function captureWarnings(): { lines: string[]; restore: () => void } {
  const lines: string[] = [];
  const original = console.warn;
  console.warn = (...args: unknown[]) => void lines.push(args.map(String).join(" "));
  return { lines, restore: () => void (console.warn = original) };
}

test("401 token_missing without a token issuer: the reports are kept, flush() says why, and they go once accepted", async () => {
  answer = { status: 401, body: JSON.stringify({ error: "token_missing", message: "this collector requires an anonymous token" }) };
  seen.length = 0;
  const warnings = captureWarnings();
  let now = Date.UTC(2026, 11, 6, 12);
  try {
    const c = await TelemetryClient.open(options({ clock: () => now }));
    for (const v of ["a", "b", "c"]) c.record("tab", v);
    const r = await c.flushResult();
    assert.equal(r.ok, false, "nothing was delivered: flush must not say all is well");
    assert.equal(await c.flush(), false, "the boolean flush() agrees");
    assert.equal(r.waiting?.reason, "tokens_required");
    assert.ok(r.waiting.message.includes(TOKENS_REQUIRED_MESSAGE) && r.waiting.message.includes("this collector requires an anonymous token"));
    assert.deepEqual([r.sent, r.refused, r.queued], [{ batches: 0, reports: 0 }, { batches: 0, reports: 0 }, 3]);
    assert.equal(seen.length, 1, "one attempt, then it backs off instead of hammering the collector");
    const e = c.errors();
    assert.equal(e.upload_tokens_required, 1);
    assert.equal(e.upload_rejected_batches, 0, "a token refusal drops nothing");
    assert.equal(await c.pendingReports(), 3, "the reports are kept");
    const spent = await c.privacySpent();
    assert.ok(Math.abs(spent.spent - 3) < 1e-9, "their ε was spent: the reason to keep them");
    assert.equal(c.lastRejection(), null);
    assert.equal(warnings.lines.length, 1, "said once");
    assert.match(warnings.lines[0] ?? "", /requires anonymous upload tokens.*no token issuer.*`tokens` option/);
    // the collector now accepts them (e.g. run without --require-tokens): after the backoff they are all sent
    answer = { status: 202, body: '{"status":"accepted"}' };
    now += 2 * 3_600_000;
    const r2 = await c.flushResult();
    assert.deepEqual([r2.ok, r2.sent.reports, r2.queued, r2.waiting], [true, 3, 0, null]);
    await c.close({ upload: false });
  } finally {
    warnings.restore();
  }
});

test("any other refusal also makes flush() false, without the token message", async () => {
  answer = { status: 400, body: JSON.stringify({ error: "bad_frame", message: "the frame is not valid" }) };
  const warnings = captureWarnings();
  try {
    const c = await TelemetryClient.open(options());
    c.record("tab", "a");
    assert.equal(await c.flush(), false);
    assert.equal(c.errors().upload_rejected_reports, 1);
    assert.equal(c.errors().upload_tokens_required, 0);
    assert.deepEqual(c.lastRejection(), { status: 400, error: "bad_frame", message: "the frame is not valid", reports: 1 });
    assert.deepEqual(warnings.lines, []);
    c.record("tab", "b");
    const r = await c.flushResult();
    assert.deepEqual([r.ok, r.refused, r.queued, r.waiting], [false, { batches: 1, reports: 1 }, 0, null]);
    assert.deepEqual(r.rejection, { status: 400, error: "bad_frame", message: "the frame is not valid", reports: 1 });
    await c.close({ upload: false });
  } finally {
    warnings.restore();
  }
});

test("accepted uploads: flush() is true and nothing is counted as refused", async () => {
  answer = { status: 202, body: '{"status":"accepted"}' };
  const c = await TelemetryClient.open(options());
  c.record("tab", "b");
  c.record("tab", "c");
  assert.equal(await c.flush(), true);
  assert.equal(c.stats().uploaded_reports, 2);
  assert.equal(c.errors().upload_rejected_batches, 0);
  assert.equal(c.lastRejection(), null);
  await c.close({ upload: false });
});
