// The shared vectors (ldp_core/vectors, written by the Python SDK: scripts/make-web-vectors) decide.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import {
  Dictionary,
  HashedDomain,
  RapporSpec,
  ReplaySource,
  canonicalBytes,
  decodeFrame,
  decodeJson,
  encodeFrame,
  encodeJson,
  fromHex,
  hex,
  makeBatch,
  makeSpec,
  makeFrequencySpec,
  reduceRange,
  specFromDict,
  utf8,
  xxh32Bytes,
  xxh32U32,
} from "../src/index.js";

const load = (name: string): any => JSON.parse(readFileSync(new URL(`../../ldp_core/vectors/${name}`, import.meta.url), "utf8"));
const XXH = load("xxh32.json");
const SPECS = load("specs.json");
const MECH = load("mechanisms.json");
const DOMAINS = load("domains.json");

test("XXH32 of UTF-8 strings (non-ASCII included) matches Python's xxhash", () => {
  assert.ok(XXH.strings.length > 40);
  for (const v of XXH.strings) assert.equal(xxh32Bytes(utf8(v.text), v.seed), v.xxh32, `${v.text} / ${v.seed}`);
});

test("XXH32 of raw bytes of every length class matches", () => {
  for (const v of XXH.bytes) assert.equal(xxh32Bytes(fromHex(v.hex), v.seed), v.xxh32, v.hex);
});

test("the encoders' XXH32 of one uint32 and multiply-shift match", () => {
  for (const v of XXH.u32) {
    assert.equal(xxh32U32(v.value, v.seed), v.xxh32);
    assert.equal(reduceRange(v.xxh32, 1000), v.reduce_1000);
    const le = new Uint8Array(4);
    new DataView(le.buffer).setUint32(0, v.value, true);
    assert.equal(xxh32Bytes(le, v.seed), v.xxh32, "the hot path agrees with the general XXH32");
  }
});

test("domain indices: dictionary and hashed, strings and integers (bigint beyond 2**53)", () => {
  const dict = new Dictionary(DOMAINS.dictionary.values, DOMAINS.dictionary.other);
  const h1 = new HashedDomain(1024, 0);
  const h7 = new HashedDomain(65536, 7);
  for (const row of DOMAINS.values) {
    const v = row.is_bigint ? BigInt(row.value) : row.value;
    assert.equal(hex(canonicalBytes(v)), row.canonical_bytes);
    assert.equal(h1.indexOf(v), row.hashed_1024_0);
    assert.equal(h7.indexOf(v), row.hashed_65536_7);
    assert.equal(dict.indexOf(v), row.dictionary);
  }
});

test("spec ids, memo derivation ids, canonical forms and record sizes of every spec", () => {
  assert.ok(SPECS.specs.length >= 25);
  for (const v of SPECS.specs) {
    const spec = makeSpec(v.name, v.given);
    assert.deepEqual(spec.toDict(), v.spec, v.name);
    assert.equal(spec.canonical, v.canonical);
    assert.equal(spec.specId, v.spec_id, v.canonical);
    assert.equal(spec.memoDerivationId, v.memo_derivation_id, `memo derivation id of ${v.canonical}`);
    assert.equal(spec.recordSize, v.record_size);
    assert.equal(specFromDict(v.spec).specId, v.spec_id, "toDict round-trips");
  }
});

for (const m of MECH.mechanisms) {
  test(`${m.name} ${m.canonical}: Python's draws give Python's bytes and frames`, () => {
    const spec = makeFrequencySpec(m.name, m.given);
    assert.equal(spec.specId, m.spec_id);
    const records: Uint8Array[] = [];
    for (const c of m.cases) {
      const src = new ReplaySource(c.draws);
      let rec: Uint8Array;
      if (spec instanceof RapporSpec) {
        const key = RapporSpec.metricSecret(fromHex(m.memo.device_secret), m.frame.metric, spec.memoDerivationId);
        rec = spec.encodeMemoized(c.value, key, src);
      } else rec = spec.encodeOne(c.value, src);
      assert.equal(src.remaining, 0, "consumed exactly Python's draws");
      assert.equal(hex(rec), c.record, `value ${c.value}`);
      records.push(rec);
    }
    const batch = makeBatch(m.frame.metric, spec, m.frame.day, records, fromHex(m.frame.batch_id));
    assert.equal(hex(encodeFrame(batch)), m.frame.binary);
    assert.equal(encodeJson(batch), m.frame.json);
    const back = decodeFrame(fromHex(m.frame.binary), spec);
    assert.equal(hex(back.records), records.map(hex).join(""));
    assert.equal(hex(decodeJson(m.frame.json, spec).records), hex(back.records));
    assert.equal(hex(back.batchId), m.frame.batch_id);
  });
}

test("RAPPOR memo: per-metric key, cohort and permanent bits match Python's", () => {
  const rappors = MECH.mechanisms.filter((m: any) => m.name === "rappor");
  assert.ok(rappors.length >= 2);
  for (const m of rappors) {
    const spec = makeSpec("rappor", m.given) as RapporSpec;
    const key = RapporSpec.metricSecret(fromHex(m.memo.device_secret), m.memo.metric, spec.memoDerivationId);
    assert.equal(hex(key), m.memo.metric_secret);
    assert.equal(spec.cohortOf(key), m.memo.cohort);
    for (const [value, bits] of Object.entries(m.memo.permanent)) assert.equal(hex(spec.permanentBits(Number(value), key)), bits);
    for (const c of m.simulation_cases) {
      const src = new ReplaySource(c.draws);
      assert.equal(hex(spec.encodeOne(c.value, src)), c.record);
      assert.equal(src.remaining, 0);
    }
  }
});
