// The minified bundle (scripts/bundle.mjs) keeps readable error names (esbuild keepNames) and reads the
// project's metrics/example.json as text: an app sees "MetricsFileError: ...", never "U: ...".
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

test("the bundled SDK's errors keep their class names and example.json parses in full", async () => {
  const dir = mkdtempSync(join(tmpdir(), "ldp-bundle-"));
  try {
    const out = join(dir, "sdk.min.js");
    const root = new URL("..", import.meta.url);
    execFileSync(process.execPath, ["scripts/bundle.mjs", out], { cwd: root, stdio: "pipe" });
    const sdk = await import(pathToFileURL(out).href);
    assert.throws(() => sdk.parseMetrics('{"format": "nope"}'), (e: Error) => e.name === "MetricsFileError" && e instanceof sdk.LDPError && String(e).startsWith("MetricsFileError: "));
    assert.equal(new sdk.ClientConfigError("x").name, "ClientConfigError");
    assert.throws(() => sdk.makeSpec("pem", { epsilon: 1, length: 8, step_bits: 0 }), { name: "SpecError" });
    assert.throws(() => sdk.padValue("", 8), { name: "DomainError" });
    const text = readFileSync(new URL("../../metrics/example.json", import.meta.url), "utf8");
    const set = sdk.parseMetrics(text, { rejectExpired: false });
    assert.equal(set.unsupported.size, 0);
    assert.equal(set.metrics.size, Object.keys(JSON.parse(text).metrics).length);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("errors from the minified bundle carry their class names", async () => {
  const out = join(mkdtempSync(join(tmpdir(), "ldp-bundle-")), "sdk.min.js");
  execFileSync(process.execPath, ["scripts/bundle.mjs", out], { encoding: "utf8" });
  const sdk = (await import(pathToFileURL(out).href)) as Record<string, new (...a: unknown[]) => Error>;
  for (const name of ["ClientConfigError", "MetricsFileError", "SealingError", "TokenError"]) {
    const E = sdk[name] as new (...a: unknown[]) => Error;
    const e = name === "TokenError" ? new E("malformed", "m") : new E("m");
    assert.equal(e.name, name);
    assert.match(String(e), new RegExp(`^${name}: m`));
  }
  const { TelemetryClient, LocalPolicy } = sdk as unknown as { TelemetryClient: new (o: unknown) => unknown; LocalPolicy: new (o: unknown) => unknown };
  assert.throws(
    () => new TelemetryClient({ collectorUrl: "http://example.org", metrics: { format: "ldp-metrics/1", metrics: {} }, policy: new LocalPolicy({ perMetricDaily: 1, totalDaily: 1 }) }),
    /^ClientConfigError: collectorUrl must use https/,
  );
});
