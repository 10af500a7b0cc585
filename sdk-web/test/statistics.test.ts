// Statistical tests of the TS encoders: bias and variance of the unbiased counts against the
// theoretical variance (spec.countVariance, the Python SDK's formulas), over repeated trials with
// fixed seeds (SimulationSource).
//
// Tolerances. With R trials, the mean error of item v has standard error sqrt(Var_v / R); the bias
// check allows 4.5 of them (two-sided p ≈ 7e-6 per item, Bonferroni over ≤ 16 items). The variance
// check pools S = Σ_{t,v} e_{t,v}² / Var_v / (R·d), whose mean is exactly 1 when countVariance is
// right; each term is ≈ χ²₁ (variance 2), so S has standard deviation about sqrt(2/(R·d)), inflated
// a little by the correlation between items of one trial; the check allows 5 of them. A wrong p or q
// (an ε off by 10 %) moves the variance by more than 15 % and fails it.
import assert from "node:assert/strict";
import { test } from "node:test";
import { SimulationSource, makeFrequencySpec, type MechanismSpec } from "../src/index.js";
import { estimateCounts, population, valuesOf } from "./support.js";

interface Case {
  name: string;
  params: Record<string, unknown>;
  /** fresh hash family per trial: the sketches' variance is an average over it */
  freshSeed?: boolean;
  n: number;
  trials: number;
}

const D = 16;
const CASES: Case[] = [
  { name: "rr", params: { epsilon: 1.0 }, n: 4000, trials: 60 },
  { name: "grr", params: { epsilon: 2.0, domain_size: D }, n: 4000, trials: 40 },
  { name: "oue", params: { epsilon: 1.0, domain_size: D }, n: 3000, trials: 40 },
  { name: "olh", params: { epsilon: 2.0, domain_size: D }, n: 3000, trials: 40 },
  { name: "hr", params: { epsilon: 1.5, domain_size: D }, n: 3000, trials: 40 },
  { name: "hr", params: { epsilon: 4.0, domain_size: D, variant: "blocks" }, n: 3000, trials: 40 },
  { name: "cms", params: { epsilon: 3.0, domain_size: D, num_hashes: 4, width: 32 }, freshSeed: true, n: 3000, trials: 40 },
  { name: "hcms", params: { epsilon: 3.0, domain_size: D, num_hashes: 4, width: 32 }, freshSeed: true, n: 3000, trials: 40 },
];

function specFor(c: Case, trial: number): MechanismSpec {
  return makeFrequencySpec(c.name, c.freshSeed ? { ...c.params, hash_seed: 7919 * trial + 13 } : c.params);
}

for (const c of CASES) {
  test(`${c.name} ${JSON.stringify(c.params)}: unbiased, with the theoretical variance`, () => {
    const d = specFor(c, 0).domainSize;
    const counts = population(d, c.n);
    const values = valuesOf(counts);
    const errors: number[][] = [];
    let variance: number[] = [];
    for (let t = 0; t < c.trials; t++) {
      const spec = specFor(c, t);
      variance = spec.countVariance(counts);
      const rng = new SimulationSource(1_000_003 * t + 17);
      const reports = values.map((v) => spec.encodeOne(v, rng));
      const est = estimateCounts(spec, reports);
      errors.push(est.map((e, v) => e - (counts[v] as number)));
    }
    let pooled = 0;
    for (let v = 0; v < d; v++) {
      const mean = errors.reduce((a, e) => a + (e[v] as number), 0) / c.trials;
      const se = Math.sqrt((variance[v] as number) / c.trials);
      assert.ok(Math.abs(mean) <= 4.5 * se, `item ${v}: mean error ${mean.toFixed(2)} exceeds 4.5 standard errors (${se.toFixed(2)})`);
      for (const e of errors) pooled += (e[v] as number) ** 2 / (variance[v] as number);
    }
    const s = pooled / (c.trials * d);
    const tol = 5 * Math.sqrt(2 / (c.trials * d));
    assert.ok(Math.abs(s - 1) <= tol, `mean squared standardized error ${s.toFixed(3)} is not 1 ± ${tol.toFixed(3)}`);
  });
}

test("the variance check has power: a population encoded at another epsilon fails it", () => {
  // Encode with ε = 1.4 but judge by the variance at ε = 1.0 (GRR): the errors are smaller than claimed.
  const claimed = makeFrequencySpec("grr", { epsilon: 1.0, domain_size: D });
  const actual = makeFrequencySpec("grr", { epsilon: 1.4, domain_size: D });
  const counts = population(D, 4000);
  const values = valuesOf(counts);
  let pooled = 0;
  const trials = 40;
  const variance = claimed.countVariance(counts);
  for (let t = 0; t < trials; t++) {
    const rng = new SimulationSource(99 + t);
    const est = estimateCounts(claimed, values.map((v) => actual.encodeOne(v, rng)));
    est.forEach((e, v) => (pooled += (e - (counts[v] as number)) ** 2 / (variance[v] as number)));
  }
  const s = pooled / (trials * D);
  assert.ok(Math.abs(s - 1) > 5 * Math.sqrt(2 / (trials * D)), `a wrong ε went unnoticed (S = ${s.toFixed(3)})`);
});
