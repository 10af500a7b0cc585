// No silent loss: a collector that refuses uploads (401 token_missing from `ldp collector --require-tokens`,
// or any other 4xx) makes flush() resolve false, the tallies count the dropped reports, and a token refusal
// is said clearly. The collector here is a real node HTTP server on 127.0.0.1 answering as the Python one
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

test("401 token_missing three times: flush() is false, the drops are counted and the reason is said", async () => {
  answer = { status: 401, body: JSON.stringify({ error: "token_missing", message: "this collector requires an anonymous token" }) };
  seen.length = 0;
  const warnings = captureWarnings();
  try {
    const c = await TelemetryClient.open(options());
    for (const v of ["a", "b", "c"]) c.record("tab", v);
    const flushed = await c.flush();
    assert.equal(flushed, false, "reports were dropped: flush() must not say all is well");
    assert.equal(seen.length, 3, "three batches of one report, each refused once");
    assert.ok(seen.every((s) => s.path === "/v1/reports" && s.bytes > 0));
    const e = c.errors();
    assert.equal(e.upload_rejected_batches, 3);
    assert.equal(e.upload_rejected_reports, 3);
    assert.equal(e.upload_tokens_required, 3);
    assert.equal(await c.pendingReports(), 0, "refused batches are not retried for ever");
    const spent = await c.privacySpent();
    assert.ok(Math.abs(spent.spent - 3) < 1e-9, "their ε was spent: the reason to say so");
    const r = c.lastRejection();
    assert.ok(r !== null);
    assert.equal(r.status, 401);
    assert.equal(r.error, "token_missing");
    assert.equal(r.reports, 1);
    assert.ok(r.message.includes(TOKENS_REQUIRED_MESSAGE) && r.message.includes("this collector requires an anonymous token"));
    assert.equal(warnings.lines.length, 1, "said once, not once per batch");
    assert.match(warnings.lines[0] ?? "", /requires anonymous upload tokens.*web SDK does not have/);
    assert.equal(await c.flush(), true, "a later flush with nothing refused is true again");
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
