// A web-SDK device driven line by line from tests/web/test_web_tokens.py, against the real Python issuer and
// collector: argv[2] is JSON {collectorUrl, issuerUrl, devicePath, origin, metrics, stock?, mirrors?, noTokens?};
// each stdin line is a command, answered by one JSON line on stdout:
//   {"op": "record", "metric": M, "values": [...]}   -> {"recorded": n}
//   {"op": "flush"}                                   -> the FlushResult
//   {"op": "state"}                                   -> {errors, stats, pending, tokens}
//   {"op": "close"}                                   -> {} (and the process exits)
// The IndexedDB is fake-indexeddb in this process: the device's state lives as long as the driver.
import "fake-indexeddb/auto";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { LocalPolicy, TelemetryClient } from "../../src/index.js";

const cfg = JSON.parse(process.argv[2] as string) as {
  collectorUrl: string;
  issuerUrl: string;
  devicePath: string;
  origin: string;
  metrics: Record<string, unknown>;
  stock?: number;
  mirrors?: string[];
  noTokens?: boolean;
};
const client = await TelemetryClient.open({
  collectorUrl: cfg.collectorUrl,
  metrics: cfg.metrics,
  policy: new LocalPolicy({ perMetricDaily: 50, totalDaily: 50 }),
  storageName: "tokens-drive",
  uploadIntervalMs: 0,
  lifecycle: false,
  batchSize: 1,
  backoffBaseMs: 1,
  backoffMaxMs: 20,
  ...(cfg.noTokens ? {} : { tokens: { issuerUrl: cfg.issuerUrl, device: readFileSync(cfg.devicePath, "utf8"), origin: cfg.origin, stock: cfg.stock ?? 4, mirrors: cfg.mirrors ?? [] } }),
});
const out = (v: unknown): void => void process.stdout.write(JSON.stringify(v) + "\n");
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const cmd = JSON.parse(line) as { op: string; metric?: string; values?: unknown[] };
  if (cmd.op === "record") {
    for (const v of cmd.values ?? []) client.record(cmd.metric as string, v);
    out({ recorded: (cmd.values ?? []).length });
  } else if (cmd.op === "flush") {
    await new Promise((r) => setTimeout(r, 25)); // past any backoff (backoffMaxMs is 20)
    out(await client.flushResult());
  } else if (cmd.op === "state") {
    out({ errors: client.errors(), stats: client.stats(), pending: await client.pendingReports() });
  } else if (cmd.op === "close") {
    await client.close({ upload: false });
    out({});
    break;
  } else out({ error: `unknown op ${cmd.op}` });
}
process.exit(0);
