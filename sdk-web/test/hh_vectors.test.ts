// Heavy hitters with the end-of-value marker against the Python SDK's vectors for it
// (ldp_core/vectors/heavy_hitters.json, written by issue 30's generator in tests/web/make_vectors.py):
// padded values and refusals of both versions, prefix keys, PEM levels and records, SFP records, frames.
// The file arrives with issue 30's branch; until that is merged this test says so (a visible skip).
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { test } from "node:test";
import { PEMSpec, ReplaySource, SFPSpec, encodeFrame, fromHex, hex, makeBatch, makeSpec, padValue, prefixKey } from "../src/index.js";

const FILE = new URL("../../ldp_core/vectors/heavy_hitters.json", import.meta.url);
const skip = existsSync(FILE) ? false : "ldp_core/vectors/heavy_hitters.json comes with issue 30 (end_marker); not merged here yet";
const HH = skip ? { values: [], prefix_keys: [], pem: [], sfp: [] } : JSON.parse(readFileSync(FILE, "utf8"));

test("padded values and refusals match Python's, under end_marker 0 and 1", { skip }, () => {
  assert.ok(HH.values.some((v: any) => v.error === "control") && HH.values.some((v: any) => v.end_marker === 0 && v.padded));
  for (const v of HH.values) {
    if (v.error) assert.throws(() => padValue(v.value, v.length, v.overflow, v.end_marker), { name: "DomainError" }, JSON.stringify(v));
    else assert.equal(hex(padValue(v.value, v.length, v.overflow, v.end_marker)), v.padded, JSON.stringify(v));
  }
  for (const k of HH.prefix_keys) assert.equal(prefixKey(fromHex(k.padded), k.bits), k.key, JSON.stringify(k));
});

function replay(c: any, enc: (src: ReplaySource) => Uint8Array): Uint8Array {
  const src = new ReplaySource(c.draws);
  const rec = enc(src);
  assert.equal(src.remaining, 0);
  assert.equal(hex(rec), c.record, c.value);
  return rec;
}

test("PEM and SFP specs with and without the marker: ids, levels, records and frames match Python's", { skip }, () => {
  assert.ok(HH.pem.length && HH.sfp.length);
  for (const v of [...HH.pem, ...HH.sfp]) {
    const spec = makeSpec(v.name, v.given) as PEMSpec | SFPSpec;
    assert.equal(spec.canonical, v.canonical);
    assert.equal(spec.specId, v.spec_id);
    assert.equal(spec.memoDerivationId, v.memo_derivation_id);
    assert.equal(spec.recordSize, v.record_size);
    if (spec instanceof PEMSpec) {
      assert.equal(spec.numLevels, v.num_levels);
      assert.equal(spec.levelForDevice(fromHex(v.device_secret)), v.level);
    }
    const records = v.cases.map((c: any) => {
      const padded = spec.pad(c.value);
      assert.equal(hex(padded), c.padded);
      if (spec instanceof SFPSpec) {
        assert.equal(spec.wordKey(padded), c.word_key);
        assert.equal(spec.wordTag(padded), c.tag);
        return replay(c, (src) => spec.encodePadded(padded, src));
      }
      assert.equal(prefixKey(padded, spec.levelBits(c.level)), c.key);
      return replay(c, (src) => spec.encodePadded(padded, src, c.level));
    });
    assert.equal(hex(encodeFrame(makeBatch(v.frame.metric, spec, v.frame.day, records, fromHex("00112233445566778899aabbccddeeff")))), v.frame.binary);
  }
});
