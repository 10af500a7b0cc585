// CORS test, run by tests/web/test_web_cors.py: a page served at its own origin (pageOrigin, by a real
// node HTTP server on that port: a page answered by request routing has no address space, and Chromium's
// local network access checks then refuse its requests to 127.0.0.1 whatever the collector answers) uses
// the built bundle to read the metrics from and upload to a collector at another origin. Whether the browser lets it is the collector's answer to
// the preflight alone. argv: pageOrigin collectorUrl chromiumPath metricsJson; stdout: JSON.
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { chromium } from "playwright-core";

const [pageOrigin, collectorUrl, executablePath, metricsJson] = process.argv.slice(2) as [string, string, string, string];
const bundlePath = "/tmp/ldp-web-cors-" + process.pid + ".js";
const { execFileSync } = await import("node:child_process");
execFileSync(process.execPath, ["scripts/bundle.mjs", bundlePath], { stdio: ["ignore", "ignore", "inherit"] });
const bundle = readFileSync(bundlePath, "utf8");
const PAGE = `<!doctype html><meta charset="utf-8"><title>ldp web cors</title>
<script type="module" src="./cors_page.js"></script>`;
const pageJs = readFileSync(new URL("./cors_page.js", import.meta.url), "utf8");

const server = createServer((request, response) => {
  const path = new URL(request.url ?? "/", pageOrigin).pathname;
  const [type, body] = path.endsWith("/ldp-telemetry.min.js")
    ? ["text/javascript", bundle]
    : path.endsWith("/cors_page.js")
      ? ["text/javascript", pageJs]
      : ["text/html", PAGE];
  response.writeHead(200, { "Content-Type": type, "Cache-Control": "no-store" });
  response.end(body);
});
const { hostname, port } = new URL(pageOrigin);
await new Promise<void>((resolve, reject) => {
  server.once("error", reject);
  server.listen(Number(port), hostname, resolve);
});
const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox", "--disable-dev-shm-usage"] });
try {
  const page = await browser.newPage();
  const consoleErrors: string[] = [];
  page.on("console", (m) => {
    if (m.type() === "error") consoleErrors.push(m.text());
  });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  const query = new URLSearchParams({ collector: collectorUrl, metrics: metricsJson });
  await page.goto(pageOrigin + "/app/index.html?" + query.toString());
  await page.waitForFunction("window.ldpResult !== undefined || window.ldpError !== undefined", undefined, { timeout: 120_000 });
  const failure = (await page.evaluate("window.ldpError")) as string | undefined;
  if (failure) throw new Error(`the page failed: ${failure}`);
  const result = (await page.evaluate("window.ldpResult")) as Record<string, unknown>;
  process.stdout.write(JSON.stringify({ ...result, consoleErrors }));
} finally {
  await browser.close();
  server.close();
}
