// The minified bundle keeps the SDK's class names, so an error thrown into an app reads
// "ClientConfigError: collectorUrl must use https ..." and not "U: ...".
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";

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
