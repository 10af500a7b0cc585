// A metrics file that mixes LDP metrics with prio3 ones (docs/PRIO3.md, as `ldp aggregator --init` writes and the
// collector serves): the web SDK keeps its LDP metrics and lists each prio3 metric as unsupported, with a reason,
// instead of refusing the whole document.
import assert from "node:assert/strict";
import { test } from "node:test";
import { parseMetrics } from "../src/metrics.js";

const base = { description: "d", owner: "o@example.org", expires: "2030-12-31", max_reports_per_day: 1 };
const key = { key_id: "00000000", public_key: "00".repeat(32) };

test("prio3 metrics are listed unsupported, the LDP ones still parse", () => {
  const doc = {
    format: "ldp-metrics/1",
    metrics: {
      tab: { ...base, mechanism: { mechanism: "grr", epsilon: 1.0 }, domain: { kind: "dictionary", values: ["a", "b"] } },
      "p.sum": { ...base, kind: "prio3", prio3: { type: "sum", max_measurement: 10 } },
    },
    prio3_aggregators: { leader: key, helper: key },
  };
  const set = parseMetrics(doc, { today: 0 });
  assert.deepEqual([...set.metrics.keys()], ["tab"]);
  assert.match(set.unsupported.get("p.sum") ?? "", /prio3 metric/);
});

test("other unknown top-level keys are still refused", () => {
  assert.throws(() => parseMetrics({ format: "ldp-metrics/1", metrics: {}, prio4: {} }, { today: 0 }), /unknown top-level key/);
});
