// Encode cost per report in Node, and the bundle's size. Usage: npm run bench (prints JSON).
import { IDBFactory } from "fake-indexeddb";
import { execFileSync } from "node:child_process";
import { performance } from "node:perf_hooks";
import * as ldp from "../src/index.js";
// @ts-expect-error plain JavaScript shared with the Chromium benchmark
import { benchEncoders, benchRecord } from "./cases.js";

const now = (): number => performance.now();
const bundle = JSON.parse(execFileSync(process.execPath, ["scripts/bundle.mjs", "/tmp/ldp-web-bench.min.js"], { encoding: "utf8" })) as Record<string, unknown>;
const encoders = benchEncoders(ldp, now);
const record = await benchRecord(ldp, now, { indexedDB: new IDBFactory() });
process.stdout.write(JSON.stringify({ runtime: `node ${process.version}`, bundle, encoders, record }, null, 1) + "\n");
