// Bundle the SDK for browsers (one minified ESM file) and print its size, raw and gzipped.
// Usage: node scripts/bundle.mjs [outfile]   (default dist/ldp-telemetry.min.js)
import { build } from "esbuild";
import { readFileSync } from "node:fs";
import { gzipSync } from "node:zlib";

const outfile = process.argv[2] ?? "dist/ldp-telemetry.min.js";
await build({
  entryPoints: ["src/index.ts"],
  bundle: true,
  minify: true,
  keepNames: true, // readable error names (ClientConfigError, TokenError, ...) in the minified bundle
  format: "esm",
  platform: "browser",
  target: "es2022",
  outfile,
  keepNames: true, // readable error names (ClientConfigError, not "U") in the minified bundle
  logLevel: "warning",
});
const code = readFileSync(outfile);
const gz = gzipSync(code, { level: 9 });
process.stdout.write(JSON.stringify({ outfile, bytes: code.length, gzip_bytes: gz.length }) + "\n");
