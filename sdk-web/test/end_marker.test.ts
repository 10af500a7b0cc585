// Heavy hitters' end-of-value marker (`end_marker: 1`, docs/HEAVY_HITTERS.md): 0x00 ends a value, so such a
// metric refuses control characters too; the encoders are unchanged; the parameter is in a spec (and its
// id) only when it is 1, so every existing spec keeps its id.
import assert from "node:assert/strict";
import { test } from "node:test";
import { PEMSpec, SFPSpec, StringDomain, hex, makeSpec, padValue, parseMetrics } from "../src/index.js";

test("end_marker 1 refuses control characters; 0 (the default) pads them as before", () => {
  for (const v of ["a\nb", "\t", "x\u007f", "tab\there"]) {
    assert.throws(() => padValue(v, 8, "truncate", 1), { name: "DomainError" }, JSON.stringify(v));
    assert.equal(padValue(v, 8, "truncate", 0).length, 8);
  }
  assert.equal(hex(padValue("weather", 8, "truncate", 1)), "7765617468657200");
  assert.equal(hex(padValue("café au lait", 4, "truncate", 1)), hex(padValue("café au lait", 4, "truncate", 0)));
  assert.throws(() => padValue("a\u0000", 8, "truncate", 1), { name: "DomainError" });
  assert.throws(() => padValue("", 8, "truncate", 1), { name: "DomainError" });
});

test("end_marker is in the spec only when it is 1: old specs keep their ids, v1 gets its own", () => {
  const v0 = makeSpec("pem", { epsilon: 4, length: 8, start_bits: 12, step_bits: 4 }) as PEMSpec;
  const v0b = makeSpec("pem", { epsilon: 4, length: 8, start_bits: 12, step_bits: 4, end_marker: 0 }) as PEMSpec;
  const v1 = makeSpec("pem", { epsilon: 4, length: 8, start_bits: 12, step_bits: 4, end_marker: 1 }) as PEMSpec;
  assert.equal(v0b.specId, v0.specId);
  assert.ok(!("end_marker" in v0.toDict()));
  assert.equal(v1.toDict().end_marker, 1);
  assert.notEqual(v1.specId, v0.specId);
  assert.equal(v1.canonical, '{"end_marker":1,"epsilon":4,"g":56,"length":8,"mechanism":"pem","overflow":"truncate","start_bits":12,"step_bits":4}');
  const s1 = makeSpec("sfp", { epsilon: 2, length: 8, end_marker: 1 }) as SFPSpec;
  assert.equal(s1.toDict().end_marker, 1);
  for (const bad of [2, "1", true, 1.5]) assert.throws(() => makeSpec("pem", { epsilon: 4, end_marker: bad }), { name: "SpecError" }, String(bad));
  // the same padded bytes and draws give the same record under both versions
  const rng = () => ({ float53: () => 0.25, below: (n: number) => n - 1, words64: () => undefined });
  assert.equal(hex(v1.encodePadded(v1.pad("news"), rng(), 3)), hex(v0.encodePadded(v0.pad("news"), rng(), 3)));
});

test("a metrics file's string domain carries end_marker to the mechanism, and a mismatch is an error", () => {
  const base = { description: "d", owner: "o@example.org", expires: "2030-12-31", max_reports_per_day: 1, kind: "heavy_hitters" };
  const doc = (mech: Record<string, unknown>, dom: Record<string, unknown>) => ({ format: "ldp-metrics/1", metrics: { w: { ...base, mechanism: mech, domain: dom } } });
  const set = parseMetrics(doc({ mechanism: "pem", epsilon: 4 }, { kind: "string", length: 8, end_marker: 1 }));
  const m = set.metrics.get("w")!;
  assert.equal((m.spec as PEMSpec).endMarker, 1);
  assert.equal((m.domain as StringDomain).endMarker, 1);
  assert.deepEqual(m.domain.toDict(), { kind: "string", length: 8, overflow: "truncate", end_marker: 1 });
  assert.throws(() => m.domain.indexOf("a\nb"), { name: "DomainError" });
  assert.throws(() => parseMetrics(doc({ mechanism: "pem", epsilon: 4, end_marker: 0 }, { kind: "string", length: 8, end_marker: 1 })), { name: "MetricsFileError" });
  assert.throws(() => parseMetrics(doc({ mechanism: "pem", epsilon: 4, end_marker: 1 }, { kind: "string", length: 8 })), { name: "MetricsFileError" });
  assert.throws(() => parseMetrics(doc({ mechanism: "sfp", epsilon: 4 }, { kind: "string", length: 8, end_marker: 3 })), { name: "MetricsFileError" });
});
