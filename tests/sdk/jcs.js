// Independent RFC 8785 check for tests/sdk/test_spec_ids.py (ldp_core/vectors/spec_ids.json):
// JSON.stringify of a value whose
// object keys were sorted (Array.prototype.sort compares UTF-16 code units) is the JCS form.
// stdin: a JSON array of values; stdout: a JSON array of [canonical string, sha256 hex].
"use strict";
const crypto = require("crypto");
function sortKeys(v) {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v !== null && typeof v === "object") {
    const out = {};
    for (const k of Object.keys(v).sort()) out[k] = sortKeys(v[k]);
    return out;
  }
  return v;
}
let input = "";
process.stdin.on("data", (c) => (input += c));
process.stdin.on("end", () => {
  const out = JSON.parse(input).map((v) => {
    const s = JSON.stringify(sortKeys(v));
    return [s, crypto.createHash("sha256").update(Buffer.from(s, "utf8")).digest("hex")];
  });
  process.stdout.write(JSON.stringify(out));
});
