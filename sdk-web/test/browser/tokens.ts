// Tokens in headless Chromium, run by tests/web/test_web_browser_tokens.py: a page on its own origin
// (pageOrigin, a real node HTTP server: a page answered by request routing has no address space, and
// Chromium's local network access checks would refuse its requests to 127.0.0.1) opens a client with the
// `tokens` option, records and flushes. The collector and the issuer are two other origins that allow the
// page's (`--allow-origin`), so the key documents, the signed token requests, the blind RSA and the paid
// uploads all run in the browser, through CORS, for real.
// argv: configJson chromiumPath, config = {pageOrigin, collectorUrl, issuerUrl, device (bundle JSON text), origin}.
import { readFileSync } from "node:fs";
import { createServer } from "node:http";
import { chromium } from "playwright-core";

const [configJson, executablePath] = process.argv.slice(2) as [string, string];
const config = JSON.parse(configJson) as { pageOrigin: string };
const bundlePath = "/tmp/ldp-web-tokens-" + process.pid + ".js";
const { execFileSync } = await import("node:child_process");
execFileSync(process.execPath, ["scripts/bundle.mjs", bundlePath], { stdio: ["ignore", "ignore", "inherit"] });
const bundle = readFileSync(bundlePath, "utf8");
const PAGE = `<!doctype html><meta charset="utf-8"><title>ldp web tokens</title>
<script type="module" src="./tokens_page.js"></script>`;
const pageJs = readFileSync(new URL("./tokens_page.js", import.meta.url), "utf8");

const server = createServer((request, response) => {
  const path = new URL(request.url ?? "/", config.pageOrigin).pathname;
  const [type, body] = path.endsWith("/ldp-telemetry.min.js")
    ? ["text/javascript", bundle]
    : path.endsWith("/tokens_page.js")
      ? ["text/javascript", pageJs]
      : path.endsWith("/config.json")
        ? ["application/json", configJson]
        : ["text/html", PAGE];
  response.writeHead(200, { "Content-Type": type, "Cache-Control": "no-store" });
  response.end(body);
});
const { hostname, port } = new URL(config.pageOrigin);
await new Promise<void>((resolve, reject) => {
  server.once("error", reject);
  server.listen(Number(port), hostname, resolve);
});
const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox", "--disable-dev-shm-usage"] });
try {
  const page = await browser.newPage();
  const consoleLines: string[] = [];
  page.on("console", (m) => consoleLines.push(`${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => consoleLines.push(`pageerror: ${String(e)}`));
  await page.goto(config.pageOrigin + "/index.html");
  await page.waitForFunction("window.ldpResult !== undefined || window.ldpError !== undefined", undefined, { timeout: 240_000 });
  const failure = (await page.evaluate("window.ldpError")) as string | undefined;
  if (failure) throw new Error(`the page failed: ${failure}\n${consoleLines.join("\n")}`);
  const result = (await page.evaluate("window.ldpResult")) as Record<string, unknown>;
  process.stdout.write(JSON.stringify({ ...result, consoleLines }));
} finally {
  await browser.close();
  server.close();
}
