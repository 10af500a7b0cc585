// Empirical privacy audit of the TS encoders. For neighbouring inputs x, x' and an event E chosen
// to be (nearly) the most telling, P[E | x] / P[E | x'] must not exceed e^ε. With N reports of each
// input, the audit takes the ratio of the lower 4.5-standard-error bound of P[E | x] to the upper
// bound of P[E | x'] (both normal bounds on a proportion): a *proven* violation only when even that
// pessimistic ratio exceeds e^ε. A tight event also gets the converse check (the optimistic ratio
// reaches e^ε), so the audit would notice a mechanism far more private than claimed, i.e. one whose
// event or constant is wrong. The last test shows the audit catching a mechanism that claims ε but
// spends 2ε.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  DBitFlipSpec,
  GRRSpec,
  HRSpec,
  LolohaSpec,
  OneBitMeanSpec,
  PEMSpec,
  SCALE,
  SFPSpec,
  SimulationSource,
  SquareWaveSpec,
  hashToRange,
  makeFrequencySpec,
  makeSpec,
  prefixKey,
  type MechanismSpec,
  type MeanSpec,
  type RandomSource,
  type ReportSpec,
} from "../src/index.js";
import { getUint } from "../src/mechanisms/base.js";
import { parity } from "../src/mechanisms/cms.js";
import type { CMSSpec, HCMSSpec, OLHSpec, RapporSpec } from "../src/index.js";
import { proportionBounds } from "./support.js";

const N = 120_000;
const Z = 4.5;

interface Audit {
  spec: ReportSpec;
  x: unknown;
  x2: unknown;
  /** how a report of a value is made (default: the frequency oracle's encodeOne) */
  encode?: (v: unknown, rng: RandomSource) => Uint8Array;
  event: (rec: Uint8Array) => boolean;
  tight: boolean;
  /** the ε the event can reach (ε1 for RAPPOR's single reports), default spec.epsilon */
  bound?: number;
  /** reports per input (default N; fewer for a fresh device key per report, whose HMACs cost ~40 µs) */
  n?: number;
}

type Encode = (v: unknown, rng: RandomSource) => Uint8Array;

function frequency(spec: ReportSpec, v: unknown, event: (r: Uint8Array) => boolean, rng: RandomSource, encode?: Encode, n = N): number {
  let k = 0;
  const enc = encode ?? ((a: unknown, r: RandomSource) => (spec as MechanismSpec).encodeOne(a as number, r));
  for (let i = 0; i < n; i++) if (event(enc(v, rng))) k++;
  return k;
}

function ratios(a: Audit, seed: number, encode?: Encode): { pessimistic: number; optimistic: number } {
  const n = a.n ?? N;
  const k1 = frequency(a.spec, a.x, a.event, new SimulationSource(seed), encode ?? a.encode, n);
  const k2 = frequency(a.spec, a.x2, a.event, new SimulationSource(seed + 1), encode ?? a.encode, n);
  const [lo1, hi1] = proportionBounds(k1, n, Z);
  const [lo2, hi2] = proportionBounds(k2, n, Z);
  return { pessimistic: lo1 / hi2, optimistic: hi1 / Math.max(lo2, 1e-12) };
}

function audits(): Audit[] {
  const out: Audit[] = [];
  const rr = makeFrequencySpec("rr", { epsilon: 1.0 });
  out.push({ spec: rr, x: 1, x2: 0, event: (r) => r[0] === 1, tight: true });
  const grr = makeFrequencySpec("grr", { epsilon: 1.5, domain_size: 8 });
  out.push({ spec: grr, x: 3, x2: 5, event: (r) => r[0] === 3, tight: true });
  const oue = makeFrequencySpec("oue", { epsilon: 1.0, domain_size: 12 });
  const bit = (r: Uint8Array, v: number): number => ((r[v >>> 3] as number) >> (v & 7)) & 1;
  out.push({ spec: oue, x: 2, x2: 9, event: (r) => bit(r, 2) === 1 && bit(r, 9) === 0, tight: true });
  const olh = makeFrequencySpec("olh", { epsilon: 1.0, domain_size: 64 }) as OLHSpec;
  // y = H_seed(5): P = p given 5; given 6 it is p/g + q(1 - 1/g) (a collision or a random hit): not tight
  out.push({ spec: olh, x: 5, x2: 6, event: (r) => getUint(r, 4, r.length - 4) === hashToRange(5, getUint(r, 0, 4), olh.g), tight: false });
  const hr = makeFrequencySpec("hr", { epsilon: 1.0, domain_size: 10 }) as HRSpec;
  out.push({ spec: hr, x: 1, x2: 4, event: (r) => hr.supports(1, r[0]!) && !hr.supports(4, r[0]!), tight: true });
  const cms = makeFrequencySpec("cms", { epsilon: 2.0, domain_size: 100, num_hashes: 8, width: 64 }) as CMSSpec;
  out.push({
    spec: cms,
    x: 10,
    x2: 20,
    event: (r) => {
      const j = r[0]!;
      const a = cms.position(j, 10);
      const b = cms.position(j, 20);
      return a !== b && bit(r.subarray(1), a) === 1 && bit(r.subarray(1), b) === 0;
    },
    tight: true,
  });
  const hcms = makeFrequencySpec("hcms", { epsilon: 1.0, domain_size: 100, num_hashes: 8, width: 64 }) as HCMSSpec;
  out.push({
    spec: hcms,
    x: 10,
    x2: 20,
    event: (r) => {
      const [j, l, b] = [r[0]!, r[1]!, r[2]!];
      const hx = parity(hcms.position(j, 10) & l);
      return hx !== parity(hcms.position(j, 20) & l) && b === hx;
    },
    tight: true,
  });
  const rappor = makeFrequencySpec("rappor", { epsilon: 3.0, domain_size: 20, num_bits: 16, num_cohorts: 2 }) as RapporSpec;
  out.push({
    spec: rappor,
    x: 1,
    x2: 2,
    event: (r) => {
      const c = r[0]!;
      const bx = new Set(rappor.bloomPositions(1, c));
      const by = new Set(rappor.bloomPositions(2, c));
      const rb = (j: number): number => ((r[2 + (j >>> 3)] as number) >> (j & 7)) & 1;
      for (const j of bx) if (!by.has(j) && rb(j) !== 1) return false;
      for (const j of by) if (!bx.has(j) && rb(j) !== 0) return false;
      return true;
    },
    tight: false,
  });
  out.push(...kindAudits());
  return out;
}

const int16 = (r: Uint8Array, off = 0): number => {
  const u = r[off]! | (r[off + 1]! << 8);
  return u >= 32768 ? u - 65536 : u;
};
/** A fresh device per report: its key from the audit's generator (the memoized encoders draw nothing else). */
const freshKey = (rng: RandomSource): Uint8Array => (rng as SimulationSource).bytes(32);

/** The numeric, repeated and heavy-hitter kinds: neighbouring inputs are the two ends of the range, two
 * buckets, two values or two strings; each event is the most telling one (tight at e^ε). */
function kindAudits(): Audit[] {
  const out: Audit[] = [];
  const duchi = makeSpec("duchi", { epsilon: 1.0, low: 0, high: 1 }) as MeanSpec;
  out.push({ spec: duchi, x: 1, x2: 0, encode: (v, r) => duchi.encodeNumber(v as number, r), event: (r) => r[0] === 1, tight: true });
  for (const name of ["pm", "hm"]) {
    // t* > 1: inside [l(1), r(1)] = [1, C] for t = 1 (and Duchi's +C_D for HM), outside [-C, -1] for t = -1
    const spec = makeSpec(name, { epsilon: 2.0, low: 0, high: 1 }) as MeanSpec;
    const thr = Math.ceil(SCALE / spec.outputBound()) + 1;
    out.push({ spec, x: 1, x2: 0, encode: (v, r) => spec.encodeNumber(v as number, r), event: (r) => int16(r) > thr, tight: true });
  }
  const sw = new SquareWaveSpec({ epsilon: 1.0, low: 0, high: 1, bins: 16 });
  let best = 0;
  for (let j = 0; j < sw.outBins; j++) if (sw.transitionProbability(j, 0) / sw.transitionProbability(j, 15) > sw.transitionProbability(best, 0) / sw.transitionProbability(best, 15)) best = j;
  out.push({ spec: sw, x: 0, x2: 1, encode: (v, r) => sw.encodeNumber(v as number, r), event: (r) => r[0] === best, tight: true });
  const one = new OneBitMeanSpec({ epsilon: 1.0, low: 0, high: 1, granularity: 4 });
  out.push({ spec: one, x: 1, x2: 0, n: 30_000, encode: (v, r) => one.encodeMemoized(v as number, freshKey(r)), event: (r) => r[0] === 1, tight: true });
  const dbf = new DBitFlipSpec({ epsilon: 2.0, low: 0, high: 8, buckets: 8, sample: 4 });
  out.push({
    spec: dbf,
    x: 1.5, // bucket 1
    x2: 2.5, // bucket 2
    n: 30_000,
    encode: (v, r) => dbf.encodeMemoized(v as number, freshKey(r)),
    event: (r) => {
      const bit = (b: number): number => {
        const at = [...r.subarray(0, 4)].indexOf(b);
        return at < 0 ? -1 : (r[4]! >> at) & 1;
      };
      return bit(1) === 1 && bit(2) === 0;
    },
    tight: true,
  });
  const lol = new LolohaSpec({ epsilon: 3.0, domain_size: 16, epsilon_one: 1.0 });
  out.push({
    spec: lol,
    x: 3,
    x2: 9,
    n: 30_000,
    bound: lol.epsilonOne, // one report: the permanent and instantaneous GRRs chained are exactly ε1
    encode: (v, r) => lol.encodeMemoized(v as number, freshKey(r), r),
    event: (r) => {
      const seed = getUint(r, 0, 4);
      const h = hashToRange(3, seed, lol.g);
      return r[4] === h && hashToRange(9, seed, lol.g) !== h;
    },
    tight: true,
  });
  const pem = new PEMSpec({ epsilon: 2.0, length: 4, start_bits: 8, step_bits: 8 });
  const keyOf = (s: string): number => prefixKey(pem.pad(s), pem.levelBits(0));
  out.push({
    spec: pem,
    x: "ab",
    x2: "zz",
    encode: (v, r) => pem.encodePadded(pem.pad(v), r, 0), // a device's level does not depend on its value
    event: (r) => {
      const seed = getUint(r, 1, 4);
      const h = hashToRange(keyOf("ab"), seed, pem.g);
      return getUint(r, 5, r.length - 5) === h && hashToRange(keyOf("zz"), seed, pem.g) !== h;
    },
    tight: true,
  });
  const sfp = new SFPSpec({ epsilon: 2.0, length: 4, sketch: "hcms", num_hashes: 8, width: 32 });
  const [pa, pb] = [sfp.pad("aaaa"), sfp.pad("bbbb")];
  const fragKey = (p: Uint8Array, pos: number): number => ((sfp.wordTag(p) << 16) | (p[2 * pos]! << 8) | p[2 * pos + 1]!) >>> 0;
  const agrees = (sk: SFPSpec["fragmentSpec"], row: number, col: number, bit: number, key: number): boolean => (parity((sk as HCMSSpec).position(row, key) & col) ^ bit) === 0;
  out.push({
    spec: sfp,
    x: "aaaa",
    x2: "bbbb",
    encode: (v, r) => sfp.encodePadded(sfp.pad(v), r),
    event: (r) => {
      // both sketches (ε(1 − share) and ε·share) tell "aaaa" from "bbbb": their ratios multiply to e^ε
      const [pos, fr, fc, fb, wr, wc, wb] = [r[0]!, r[1]!, r[2]!, r[3]!, r[4]!, r[5]!, r[6]!];
      const f = agrees(sfp.fragmentSpec, fr, fc, fb, fragKey(pa, pos)) && !agrees(sfp.fragmentSpec, fr, fc, fb, fragKey(pb, pos));
      const w = agrees(sfp.wordSpec, wr, wc, wb, sfp.wordKey(pa)) && !agrees(sfp.wordSpec, wr, wc, wb, sfp.wordKey(pb));
      return f && w;
    },
    tight: true,
  });
  return out;
}

for (const [i, a] of audits().entries()) {
  test(`privacy audit ${a.spec.name} ${a.spec.canonical}: P[E|x]/P[E|x'] <= e^eps`, () => {
    const { pessimistic, optimistic } = ratios(a, 1000 * i + 1);
    const e = Math.exp(a.bound ?? a.spec.epsilon);
    assert.ok(pessimistic <= e, `a proven violation: even the pessimistic ratio ${pessimistic.toFixed(3)} exceeds e^eps = ${e.toFixed(3)}`);
    if (a.tight) assert.ok(optimistic >= e, `the event should reach e^eps = ${e.toFixed(3)}, but at most ${optimistic.toFixed(3)}: wrong event or constant`);
  });
}

test("the audit catches GRR that claims eps but randomizes at 2 eps", () => {
  const claimed = new GRRSpec({ epsilon: 1.0, domain_size: 8 });
  const leaky = new GRRSpec({ epsilon: 2.0, domain_size: 8 });
  const a: Audit = { spec: claimed, x: 3, x2: 5, event: (r) => r[0] === 3, tight: true };
  const { pessimistic } = ratios(a, 77, (v, rng) => leaky.encodeOne(v as number, rng));
  assert.ok(pessimistic > Math.exp(claimed.epsilon), `the leak went unnoticed: ${pessimistic.toFixed(3)}`);
});

test("the audit catches HR whose output ignores the privacy coin", () => {
  const hr = new HRSpec({ epsilon: 1.0, domain_size: 10 });
  const a: Audit = { spec: hr, x: 1, x2: 4, event: (r) => hr.supports(1, r[0]!) && !hr.supports(4, r[0]!), tight: true };
  // a broken encoder: always a uniform element of C_x (p = 1)
  const broken = (v: unknown, rng: RandomSource): Uint8Array => {
    for (;;) {
      const y = rng.below(hr.outputSize);
      if (hr.supports(v as number, y)) return Uint8Array.of(y);
    }
  };
  const { pessimistic } = ratios(a, 91, broken);
  assert.ok(pessimistic > Math.exp(hr.epsilon), `the leak went unnoticed: ${pessimistic.toFixed(3)}`);
});
