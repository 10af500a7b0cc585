// The numeric, repeated and heavy-hitter kinds against the shared vectors (ldp_core/vectors/kinds.json,
// written by the Python SDK: scripts/make-web-vectors, tests/web/kind_vectors.py): Python's draws replayed
// through the TypeScript encoders give Python's record bytes and frames.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import {
  DBitFlipSpec,
  EPSILON_STAR,
  LolohaSpec,
  MeanSpec,
  NumericSpec,
  OneBitMeanSpec,
  PEMSpec,
  RapporSpec,
  ReplaySource,
  SFPSpec,
  bestMeanMechanism,
  decodeFrame,
  decodeJson,
  encodeFrame,
  encodeJson,
  encodeReport,
  fromHex,
  hex,
  makeBatch,
  makeSpec,
  padValue,
  prefixKey,
  specFromDict,
  type ReportSpec,
} from "../src/index.js";

const KINDS = JSON.parse(readFileSync(new URL("../../ldp_core/vectors/kinds.json", import.meta.url), "utf8"));

function checkIds(v: any): ReportSpec {
  const spec = makeSpec(v.name, v.given);
  assert.deepEqual(spec.toDict(), v.spec, v.name);
  assert.equal(spec.canonical, v.canonical);
  assert.equal(spec.specId, v.spec_id, v.canonical);
  assert.equal(spec.memoDerivationId, v.memo_derivation_id, `memo derivation id of ${v.canonical}`);
  assert.equal(spec.recordSize, v.record_size);
  assert.equal(specFromDict(v.spec).specId, v.spec_id, "toDict round-trips");
  return spec;
}

function checkFrame(v: any, spec: ReportSpec, records: Uint8Array[]): void {
  const batch = makeBatch(v.frame.metric, spec, v.frame.day, records, fromHex(v.frame.batch_id));
  assert.equal(hex(encodeFrame(batch)), v.frame.binary);
  assert.equal(encodeJson(batch), v.frame.json);
  const back = decodeFrame(fromHex(v.frame.binary), spec);
  assert.equal(hex(back.records), records.map(hex).join(""));
  assert.equal(hex(decodeJson(v.frame.json, spec).records), hex(back.records));
}

function replay(c: any, encode: (src: ReplaySource) => Uint8Array): Uint8Array {
  const src = new ReplaySource(c.draws);
  const rec = encode(src);
  assert.equal(src.remaining, 0, "consumed exactly Python's draws");
  assert.equal(hex(rec), c.record, `value ${JSON.stringify(c.value)}`);
  return rec;
}

for (const v of KINDS.numeric) {
  test(`${v.name} ${v.canonical.slice(0, 90)}: Python's draws give Python's bytes and frames`, () => {
    const spec = checkIds(v) as NumericSpec;
    const records = v.cases.map((c: any) => replay(c, (src) => spec.encodeNumber(c.value, src)));
    checkFrame(v, spec, records);
  });
}

for (const v of KINDS.memoized) {
  test(`${v.name} ${v.canonical.slice(0, 90)}: memoized reports (derived from the device secret) match Python's`, () => {
    const spec = checkIds(v);
    const key = RapporSpec.metricSecret(fromHex(v.device_secret), v.frame.metric, spec.memoDerivationId);
    assert.equal(hex(key), v.metric_secret);
    const ctx = (src: ReplaySource) => ({ rng: src, deviceSecret: fromHex(v.device_secret), metricKey: () => key });
    const records = v.cases.map((c: any) => replay(c, (src) => encodeReport(spec, c.value, ctx(src))));
    checkFrame(v, spec, records);
    for (const c of v.simulation_cases ?? []) {
      replay(c, (src) => (spec instanceof LolohaSpec ? spec.encodeOne(c.value, src) : (spec as OneBitMeanSpec).encodeNumber(c.value, src)));
    }
    assert.ok(spec instanceof OneBitMeanSpec || spec instanceof DBitFlipSpec || spec instanceof LolohaSpec);
    assert.ok(spec.memoized);
  });
}

for (const v of KINDS.pem) {
  test(`pem ${v.canonical.slice(0, 90)}: levels, prefix keys, records and frames match Python's`, () => {
    const spec = checkIds({ ...v, name: "pem" }) as PEMSpec;
    assert.equal(spec.numLevels, v.num_levels);
    assert.equal(spec.levelForDevice(fromHex(v.device_secret)), v.device_level);
    const records = v.cases.map((c: any) => {
      const padded = spec.pad(c.value);
      assert.equal(hex(padded), c.padded);
      assert.equal(prefixKey(padded, spec.levelBits(c.level)), c.key, `${c.value} at level ${c.level}`);
      return replay(c, (src) => spec.encodePadded(padded, src, c.level));
    });
    checkFrame(v, spec, records);
    replay(v.simulation_case, (src) => spec.encodePadded(spec.pad(v.simulation_case.value), src));
  });
}

for (const v of KINDS.sfp) {
  test(`sfp ${v.canonical.slice(0, 90)}: word keys, tags, records and frames match Python's`, () => {
    const spec = checkIds({ ...v, name: "sfp" }) as SFPSpec;
    const records = v.cases.map((c: any) => {
      const padded = spec.pad(c.value);
      assert.equal(spec.wordKey(padded), c.word_key);
      assert.equal(spec.wordTag(padded), c.tag);
      return replay(c, (src) => spec.encodePadded(padded, src));
    });
    checkFrame(v, spec, records);
  });
}

test("heavy-hitter values are padded, truncated and refused as Python does", () => {
  assert.ok(KINDS.pad_values.some((p: any) => p.error) && KINDS.pad_values.some((p: any) => p.padded));
  for (const p of KINDS.pad_values) {
    if (p.error) assert.throws(() => padValue(p.value, p.length, p.overflow), { name: "DomainError" }, JSON.stringify(p));
    else assert.equal(hex(padValue(p.value, p.length, p.overflow)), p.padded, JSON.stringify(p));
  }
});

test('"auto" picks the mean mechanism Python picks, around ε* too', () => {
  assert.equal(EPSILON_STAR, KINDS.auto.epsilon_star);
  for (const c of KINDS.auto.choices) assert.equal(bestMeanMechanism(c.epsilon, c.dims), c.mechanism, JSON.stringify(c));
  assert.ok(makeSpec("hm", { epsilon: 1, low: 0, high: 1 }) instanceof MeanSpec);
});
