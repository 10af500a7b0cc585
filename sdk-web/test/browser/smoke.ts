// Browser smoke test, run by tests/web/test_web_browser.py: a page using the built bundle records and
// uploads from headless Chromium to the real collector. The page is served (by Playwright's request
// routing) at the collector's own origin, as an app and its collector path would be, so uploads are
// same-origin. Phase 1 records and flushes by fetch; phase 2 records with the network failing, so the
// batch is formed and stored, then fires `pagehide`: the batch leaves by navigator.sendBeacon (or
// fetch with keepalive). With `bench` it also times the encoders in the page.
// argv: collectorUrl chromiumPath [bench]; stdout: JSON.
import { readFileSync } from "node:fs";
import { chromium } from "playwright-core";

const [collectorUrl, executablePath, mode] = process.argv.slice(2) as [string, string, string | undefined];
const bundlePath = "/tmp/ldp-web-smoke-" + process.pid + ".js";
const { execFileSync } = await import("node:child_process");
execFileSync(process.execPath, ["scripts/bundle.mjs", bundlePath], { stdio: ["ignore", "ignore", "inherit"] });
const bundle = readFileSync(bundlePath, "utf8");

const PAGE = `<!doctype html><meta charset="utf-8"><title>ldp web smoke</title>
<script type="module" src="./page.js"></script>`;
// The page's program is plain JavaScript (page.js beside this file), served as is: code that tsx
// compiled could not be handed to the browser.
const pageJs = readFileSync(new URL("./page.js", import.meta.url), "utf8");

const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox", "--disable-dev-shm-usage"] });
try {
  const page = await browser.newPage();
  const consoleErrors: string[] = [];
  page.on("console", (m) => {
    if (m.type() === "error") consoleErrors.push(m.text());
  });
  page.on("pageerror", (e) => consoleErrors.push(String(e)));
  await page.route(collectorUrl + "/__sdk/**", async (route) => {
    const url = route.request().url();
    if (url.endsWith("/ldp-telemetry.min.js")) await route.fulfill({ status: 200, contentType: "text/javascript", body: bundle });
    else if (url.endsWith("/page.js")) await route.fulfill({ status: 200, contentType: "text/javascript", body: pageJs });
    else await route.fulfill({ status: 200, contentType: "text/html", body: PAGE });
  });
  await page.goto(collectorUrl + "/__sdk/index.html" + (mode === "bench" ? "#bench" : ""));
  await page.waitForFunction("window.ldpResult !== undefined || window.ldpError !== undefined", undefined, { timeout: 240_000 });
  const failure = (await page.evaluate("window.ldpError")) as string | undefined;
  if (failure) throw new Error(`the page failed: ${failure}`);
  const result = (await page.evaluate("window.ldpResult")) as Record<string, unknown>;
  process.stdout.write(JSON.stringify({ ...result, consoleErrors }));
} finally {
  await browser.close();
}
