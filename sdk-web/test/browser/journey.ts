// The web journey, run by tests/web/test_web_journey.py: each page of the plan is served at its own origin
// (a real node HTTP server on that port: Chromium's local network access checks refuse requests from a page
// that has no address space) with the built bundle and test/browser/journey_page.js; one headless Chromium
// opens them in turn and the pages upload cross-origin to the collector of the plan.
// argv: planFile chromiumPath; the plan: {pages: [{origin, ...page plan}]}; stdout: JSON {pages: [...]}.
import { execFileSync } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { chromium } from "playwright-core";

interface PagePlan {
  origin: string;
  [key: string]: unknown;
}

const [planFile, executablePath] = process.argv.slice(2) as [string, string];
const plan = JSON.parse(readFileSync(planFile, "utf8")) as { pages: PagePlan[] };
const bundlePath = "/tmp/ldp-web-journey-" + process.pid + ".js";
const bundleInfo = JSON.parse(execFileSync(process.execPath, ["scripts/bundle.mjs", bundlePath], { encoding: "utf8" })) as Record<string, unknown>;
const bundle = readFileSync(bundlePath, "utf8");
rmSync(bundlePath);
const pageJs = readFileSync(new URL("./journey_page.js", import.meta.url), "utf8");
const HTML = `<!doctype html><meta charset="utf-8"><title>ldp web journey</title>
<script type="module" src="./journey_page.js"></script>`;

function serve(page: PagePlan): Promise<Server> {
  const body = JSON.stringify(page);
  const server = createServer((request, response) => {
    const path = new URL(request.url ?? "/", page.origin).pathname;
    const [type, text] = path.endsWith("/ldp-telemetry.min.js")
      ? ["text/javascript", bundle]
      : path.endsWith("/journey_page.js")
        ? ["text/javascript", pageJs]
        : path.endsWith("/plan.json")
          ? ["application/json", body]
          : ["text/html", HTML];
    response.writeHead(200, { "Content-Type": type, "Cache-Control": "no-store" });
    response.end(text);
  });
  const { hostname, port } = new URL(page.origin);
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(Number(port), hostname, () => resolve(server));
  });
}

const servers = await Promise.all(plan.pages.map(serve));
const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox", "--disable-dev-shm-usage"] });
const results: unknown[] = [];
try {
  for (const p of plan.pages) {
    const context = await browser.newContext(); // a fresh profile per page: its own IndexedDB
    const page = await context.newPage();
    const consoleErrors: string[] = [];
    page.on("console", (m) => {
      if (m.type() === "error") consoleErrors.push(m.text());
    });
    page.on("pageerror", (e) => consoleErrors.push(String(e)));
    await page.goto(p.origin + "/app/index.html");
    await page.waitForFunction("window.ldpResult !== undefined || window.ldpError !== undefined", undefined, { timeout: 600_000 });
    const failure = (await page.evaluate("window.ldpError")) as string | undefined;
    if (failure) throw new Error(`the page at ${p.origin} failed: ${failure}`);
    const result = (await page.evaluate("window.ldpResult")) as Record<string, unknown>;
    results.push({ ...result, consoleErrors: consoleErrors.slice(0, 20), consoleErrorCount: consoleErrors.length });
    await context.close();
  }
} finally {
  await browser.close();
  for (const s of servers) s.close();
}
process.stdout.write(JSON.stringify({ bundle: bundleInfo, pages: results }));
