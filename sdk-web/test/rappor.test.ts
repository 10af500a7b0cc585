// RAPPOR's bit probabilities, statistically (fixed seeds). Tolerances: a proportion k/N of a
// Bernoulli(π) is within 4.5 standard errors sqrt(π(1-π)/N) of π except with probability 7e-6.
import assert from "node:assert/strict";
import { test } from "node:test";
import { RapporSpec, SimulationSource } from "../src/index.js";

function bitOf(rec: Uint8Array, j: number): number {
  return ((rec[2 + (j >>> 3)] as number) >> (j & 7)) & 1;
}

function assertProportion(k: number, n: number, pi: number, what: string): void {
  const se = Math.sqrt((pi * (1 - pi)) / n);
  assert.ok(Math.abs(k / n - pi) <= 4.5 * se, `${what}: ${(k / n).toFixed(4)} vs ${pi.toFixed(4)} (se ${se.toFixed(4)})`);
}

const SPEC = new RapporSpec({ epsilon: 2.0, domain_size: 20, num_bits: 16, num_cohorts: 4 });

test("simulation encoder: uniform cohorts; filter bits 1 w.p. q*, others p*", () => {
  const rng = new SimulationSource(5);
  const n = 40_000;
  const x = 7;
  const cohortCounts = new Array<number>(SPEC.numCohorts).fill(0);
  let on = 0, onOnes = 0, off = 0, offOnes = 0;
  for (let i = 0; i < n; i++) {
    const rec = SPEC.encodeOne(x, rng);
    const c = rec[0]! | (rec[1]! << 8);
    cohortCounts[c]! += 1;
    const filter = new Set(SPEC.bloomPositions(x, c));
    for (let j = 0; j < SPEC.numBits; j++) {
      if (filter.has(j)) (on++, (onOnes += bitOf(rec, j)));
      else (off++, (offOnes += bitOf(rec, j)));
    }
  }
  cohortCounts.forEach((k, c) => assertProportion(k, n, 1 / SPEC.numCohorts, `cohort ${c}`));
  assertProportion(onOnes, on, SPEC.qStar, "filter bits");
  assertProportion(offOnes, off, SPEC.pStar, "other bits");
});

test("memoized: the PRR over devices keeps a bit w.p. 1-f, a report's IRR is q over 1 and p over 0", () => {
  const rng = new SimulationSource(11);
  const x = 3;
  let on = 0, onOnes = 0, off = 0, offOnes = 0;
  const devices = 6000;
  for (let i = 0; i < devices; i++) {
    const key = rng.bytes(32);
    const prr = SPEC.permanentBits(x, key);
    const filter = new Set(SPEC.bloomPositions(x, SPEC.cohortOf(key)));
    for (let j = 0; j < SPEC.numBits; j++) {
      const b = ((prr[j >>> 3] as number) >> (j & 7)) & 1;
      if (filter.has(j)) (on++, (onOnes += b));
      else (off++, (offOnes += b));
    }
  }
  assertProportion(onOnes, on, 1 - SPEC.f / 2, "PRR of filter bits");
  assertProportion(offOnes, off, SPEC.f / 2, "PRR of other bits");

  const key = rng.bytes(32);
  const prr = SPEC.permanentBits(x, key);
  assert.deepEqual(SPEC.permanentBits(x, key), prr, "the PRR is memoized: a pure function of (key, spec, value)");
  const reports = 30_000;
  const ones = new Array<number>(SPEC.numBits).fill(0);
  for (let i = 0; i < reports; i++) {
    const rec = SPEC.encodeMemoized(x, key, rng);
    assert.equal(rec[0]! | (rec[1]! << 8), SPEC.cohortOf(key), "a device keeps its cohort");
    for (let j = 0; j < SPEC.numBits; j++) ones[j]! += bitOf(rec, j);
  }
  for (let j = 0; j < SPEC.numBits; j++) {
    const b = ((prr[j >>> 3] as number) >> (j & 7)) & 1;
    assertProportion(ones[j] as number, reports, b ? SPEC.q : SPEC.p, `IRR of bit ${j} (PRR ${b})`);
  }
});
