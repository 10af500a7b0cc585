// Encode cost per report in headless Chromium (Debian's /usr/bin/chromium, or LDP_CHROMIUM):
// the bundle and bench/cases.js served from a loopback HTTP server, timed in the page with
// performance.now(). Usage: npm run bench:chromium (prints JSON).
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { chromium } from "playwright-core";

const bundlePath = "/tmp/ldp-web-bench-" + process.pid + ".min.js";
const bundle = JSON.parse(execFileSync(process.execPath, ["scripts/bundle.mjs", bundlePath], { encoding: "utf8" })) as Record<string, unknown>;
const files: Record<string, [string, string]> = {
  "/": ["text/html", '<!doctype html><meta charset="utf-8"><script type="module" src="/page.js"></script>'],
  "/ldp-telemetry.min.js": ["text/javascript", readFileSync(bundlePath, "utf8")],
  "/cases.js": ["text/javascript", readFileSync(new URL("./cases.js", import.meta.url), "utf8")],
  "/page.js": [
    "text/javascript",
    `import * as ldp from "/ldp-telemetry.min.js";
import { benchEncoders, benchRecord } from "/cases.js";
const now = () => performance.now();
(async () => {
  const encoders = benchEncoders(ldp, now);
  const record = await benchRecord(ldp, now, {});
  window.ldpResult = { encoders, record, userAgent: navigator.userAgent, isolated: self.crossOriginIsolated };
})().catch((e) => (window.ldpError = String(e.stack || e)));`,
  ],
};
const server = createServer((req, res) => {
  const f = files[req.url ?? "/"];
  // cross-origin isolation gives performance.now() 5 µs resolution instead of 100 µs
  res.writeHead(f ? 200 : 404, { "Content-Type": f?.[0] ?? "text/plain", "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp" });
  res.end(f?.[1] ?? "");
});
await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
const port = (server.address() as AddressInfo).port;
const browser = await chromium.launch({ executablePath: process.env.LDP_CHROMIUM ?? "/usr/bin/chromium", headless: true, args: ["--no-sandbox", "--disable-dev-shm-usage"] });
try {
  const page = await browser.newPage();
  await page.goto(`http://127.0.0.1:${port}/`);
  await page.waitForFunction("window.ldpResult !== undefined || window.ldpError !== undefined", undefined, { timeout: 300_000 });
  const err = (await page.evaluate("window.ldpError")) as string | undefined;
  if (err) throw new Error(err);
  const result = (await page.evaluate("window.ldpResult")) as Record<string, unknown>;
  process.stdout.write(JSON.stringify({ runtime: "chromium", bundle, ...result }, null, 1) + "\n");
} finally {
  await browser.close();
  server.close();
}
