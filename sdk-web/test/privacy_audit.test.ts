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
import { GRRSpec, HRSpec, SimulationSource, hashToRange, makeFrequencySpec, type MechanismSpec, type RandomSource } from "../src/index.js";
import { getUint } from "../src/mechanisms/base.js";
import { parity } from "../src/mechanisms/cms.js";
import type { CMSSpec, HCMSSpec, OLHSpec, RapporSpec } from "../src/index.js";
import { proportionBounds } from "./support.js";

const N = 120_000;
const Z = 4.5;

interface Audit {
  spec: MechanismSpec;
  x: number;
  x2: number;
  event: (rec: Uint8Array) => boolean;
  tight: boolean;
  /** the ε the event can reach (ε1 for RAPPOR's single reports), default spec.epsilon */
  bound?: number;
}

function frequency(spec: MechanismSpec, v: number, event: (r: Uint8Array) => boolean, rng: RandomSource, encode?: (v: number, rng: RandomSource) => Uint8Array): number {
  let k = 0;
  for (let i = 0; i < N; i++) if (event((encode ?? ((a, r) => spec.encodeOne(a, r)))(v, rng))) k++;
  return k;
}

function ratios(a: Audit, seed: number, encode?: (v: number, rng: RandomSource) => Uint8Array): { pessimistic: number; optimistic: number } {
  const k1 = frequency(a.spec, a.x, a.event, new SimulationSource(seed), encode);
  const k2 = frequency(a.spec, a.x2, a.event, new SimulationSource(seed + 1), encode);
  const [lo1, hi1] = proportionBounds(k1, N, Z);
  const [lo2, hi2] = proportionBounds(k2, N, Z);
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
  const { pessimistic } = ratios(a, 77, (v, rng) => leaky.encodeOne(v, rng));
  assert.ok(pessimistic > Math.exp(claimed.epsilon), `the leak went unnoticed: ${pessimistic.toFixed(3)}`);
});

test("the audit catches HR whose output ignores the privacy coin", () => {
  const hr = new HRSpec({ epsilon: 1.0, domain_size: 10 });
  const a: Audit = { spec: hr, x: 1, x2: 4, event: (r) => hr.supports(1, r[0]!) && !hr.supports(4, r[0]!), tight: true };
  // a broken encoder: always a uniform element of C_x (p = 1)
  const broken = (v: number, rng: RandomSource): Uint8Array => {
    for (;;) {
      const y = rng.below(hr.outputSize);
      if (hr.supports(v, y)) return Uint8Array.of(y);
    }
  };
  const { pessimistic } = ratios(a, 91, broken);
  assert.ok(pessimistic > Math.exp(hr.epsilon), `the leak went unnoticed: ${pessimistic.toFixed(3)}`);
});
