// Statistical tests of the numeric, repeated and heavy-hitter encoders, with fixed seeds (SimulationSource;
// device keys drawn from it for the memoized encoders, one per simulated device).
//
// Tolerances (false-alarm rate below 1e-6 for every check):
// * BIAS_Z = 5.3 standard errors for one z-statistic (two-sided normal tail 1.2e-7); SE from the
//   variance formula named at each check (means: the mechanism's summand variance, Wang et al. 2019,
//   plus at most (C/32767)²/4 of stochastic rounding per report, added to the bound);
// * MANY_Z = 5.6 when a check tests up to 16 statistics at once (2.1e-8 each, Bonferroni < 3.4e-7);
// * Pearson χ² goodness of fit against the exact output distribution, at the 1 − 1e-6 quantile of χ²(df)
//   by the Wilson–Hilferty approximation (z = 4.753).
// * Variance checks pool the R squared standardized errors of R trials: mean 1 when the variance formula
//   is right, standard deviation sqrt(2/R) (χ²₁ terms); the check allows VAR_Z = 5 of them plus the
//   χ² skew (a one-sided 5-sigma miss of a mean of ≥ 40 χ²₁ terms has probability below 1e-6).
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  DBitFlipSpec,
  LolohaSpec,
  MeanSpec,
  OneBitMeanSpec,
  PEMSpec,
  SCALE,
  SFPSpec,
  SimulationSource,
  SquareWaveSpec,
  hashToRange,
  makeSpec,
  prefixKey,
} from "../src/index.js";
import { getUint } from "../src/mechanisms/base.js";
import { parity } from "../src/mechanisms/cms.js";

const BIAS_Z = 5.3;
const MANY_Z = 5.6;
const VAR_Z = 5;

/** The 1 − 1e-6 quantile of χ²(df), Wilson–Hilferty. */
function chi2Crit(df: number): number {
  const z = 4.753;
  const a = 2 / (9 * df);
  return df * (1 - a + z * Math.sqrt(a)) ** 3;
}

function keys(rng: SimulationSource, n: number): Uint8Array[] {
  return Array.from({ length: n }, () => rng.bytes(32));
}

const MEANS: { name: string; params: Record<string, unknown> }[] = [
  { name: "duchi", params: { epsilon: 1.0, low: 0, high: 240 } },
  { name: "pm", params: { epsilon: 2.0, low: 0, high: 240 } },
  { name: "hm", params: { epsilon: 1.0, low: 0, high: 240 } },
  { name: "hm", params: { epsilon: 6.0, low: -1, high: 1, dims: 4 } },
  { name: "duchi", params: { epsilon: 4.0, low: -1, high: 1, dims: 3, sample: 1 } },
];

for (const c of MEANS) {
  test(`${c.name} ${JSON.stringify(c.params)}: the mean is unbiased with the summand variance`, () => {
    const spec = makeSpec(c.name, c.params) as MeanSpec;
    const n = 2000;
    const trials = 40;
    const d = spec.dims;
    const k = spec.k;
    // a fixed population: attribute j of user i at a spread of points of [low, high]
    const values = Array.from({ length: n }, (_, i) => Array.from({ length: d }, (_, j) => spec.low + ((((i * 7 + j * 13) % 101) / 100) * (spec.high - spec.low))));
    const ts = values.map((row) => row.map((v) => spec.normalize(v)));
    const truth = Array.from({ length: d }, (_, j) => ts.reduce((a, r) => a + (r[j] as number), 0) / n);
    const rounding = (spec.outputBound() / SCALE) ** 2 / 4;
    const variance = Array.from({ length: d }, (_, j) => (ts.reduce((a, r) => a + spec.summandVariance(r[j] as number), 0) + (spec.name === "duchi" && d === 1 ? 0 : n * (d / k) * rounding)) / (n * n));
    let pooled = 0;
    const sums = new Array<number>(d).fill(0);
    for (let t = 0; t < trials; t++) {
      const rng = new SimulationSource(31337 + 7919 * t);
      const est = new Array<number>(d).fill(0);
      for (let i = 0; i < n; i++) {
        const rec = spec.encodeNumber(d === 1 ? (values[i]![0] as number) : values[i]!, rng);
        if (d === 1) est[0]! += spec.tStarOf(rec);
        else {
          const size = d <= 256 ? 1 : 2;
          for (let s = 0; s < k; s++) {
            const attr = rec[size * s]!;
            const u = rec[size * k + 2 * s]! | (rec[size * k + 2 * s + 1]! << 8);
            est[attr]! += ((u >= 32768 ? u - 65536 : u) * spec.outputBound()) / SCALE;
          }
        }
      }
      for (let j = 0; j < d; j++) {
        const e = (((d / k) * est[j]!) / n) - truth[j]!;
        sums[j]! += e;
        pooled += (e * e) / variance[j]!;
      }
    }
    for (let j = 0; j < d; j++) {
      const se = Math.sqrt(variance[j]! / trials);
      assert.ok(Math.abs(sums[j]! / trials) <= MANY_Z * se, `attribute ${j}: mean error ${sums[j]! / trials} beyond ${MANY_Z} SE (${se})`);
    }
    const s = pooled / (trials * d);
    const tol = VAR_Z * Math.sqrt(2 / (trials * d));
    assert.ok(Math.abs(s - 1) <= tol, `mean squared standardized error ${s.toFixed(3)} is not 1 ± ${tol.toFixed(3)}`);
  });
}

test("the mean variance check has power: PM encoded at 1.5 ε fails the ε variance", () => {
  const claimed = makeSpec("pm", { epsilon: 1.0, low: 0, high: 1 }) as MeanSpec;
  const actual = makeSpec("pm", { epsilon: 1.5, low: 0, high: 1 }) as MeanSpec;
  const n = 500;
  const trials = 200; // the variances differ by a factor 0.37: 200 trials resolve that at VAR_Z
  const v = claimed.summandVariance(0) / n;
  let pooled = 0;
  for (let t = 0; t < trials; t++) {
    const rng = new SimulationSource(4242 + t);
    let est = 0;
    for (let i = 0; i < n; i++) est += actual.tStarOf(actual.encodeNumber(0.5, rng));
    pooled += (est / n) ** 2 / v;
  }
  assert.ok(Math.abs(pooled / trials - 1) > VAR_Z * Math.sqrt(2 / trials), `a wrong ε went unnoticed (${pooled / trials})`);
});

for (const params of [
  { epsilon: 1.0, low: 0, high: 240, bins: 64 },
  { epsilon: 3.0, low: -1, high: 1.5, bins: 40 },
]) {
  test(`sw ${JSON.stringify(params)}: reports follow the exact transition matrix (Pearson χ²)`, () => {
    const spec = new SquareWaveSpec(params);
    const n = 100_000;
    for (const [value, seed] of [
      [params.low, 5],
      [(params.low + params.high) / 3, 6],
      [params.high, 7],
    ] as const) {
      const i = spec.inputBin(value);
      const counts = new Array<number>(spec.outBins).fill(0);
      const rng = new SimulationSource(seed);
      for (let r = 0; r < n; r++) counts[getUint(spec.encodeNumber(value, rng), 0, spec.recordSize)]! += 1;
      let chi = 0;
      let total = 0;
      for (let j = 0; j < spec.outBins; j++) {
        const m = spec.transitionProbability(j, i);
        total += m;
        chi += (counts[j]! - n * m) ** 2 / (n * m);
      }
      assert.ok(Math.abs(total - 1) < 1e-9, "the matrix's column sums to 1");
      assert.ok(chi <= chi2Crit(spec.outBins - 1), `value ${value}: χ² ${chi.toFixed(1)} above ${chi2Crit(spec.outBins - 1).toFixed(1)}`);
    }
  });
}

test("1bitmean memoized over distinct devices: P[bit = 1] = p(t) exactly (α-rounding is unbiased)", () => {
  const spec = new OneBitMeanSpec({ epsilon: 1.0, low: 0, high: 100, granularity: 8 });
  const n = 8000;
  const ks = keys(new SimulationSource(11), n);
  for (const value of [0, 33.3, 61, 100]) {
    const p = spec.bitProbability(value / 100);
    let ones = 0;
    for (const key of ks) ones += spec.encodeMemoized(value, key)[0]!;
    const z = (ones - n * p) / Math.sqrt(n * p * (1 - p));
    assert.ok(Math.abs(z) <= MANY_Z, `value ${value}: z = ${z.toFixed(2)}`);
  }
});

test("dbitflip memoized over distinct devices: unbiased bucket shares with the exact share variance", () => {
  const spec = new DBitFlipSpec({ epsilon: 2.0, low: 0, high: 16, buckets: 16, sample: 4 });
  const n = 20_000;
  const ks = keys(new SimulationSource(12), n);
  const counts = new Array<number>(16).fill(0);
  const sums = new Array<number>(16).fill(0);
  const e = spec.eHalf;
  ks.forEach((key, i) => {
    const value = (i * i) % 16; // buckets hit unevenly
    counts[spec.bucketOf(value)]! += 1;
    const rec = spec.encodeMemoized(value, key);
    for (let s = 0; s < spec.d; s++) {
      const b = ((rec[spec.d + (s >>> 3)]! >> (s & 7)) & 1) as number;
      sums[rec[s]!]! += (b * (e + 1) - 1) / (e - 1);
    }
  });
  const variance = spec.shareVariance(counts);
  for (let v = 0; v < 16; v++) {
    const h = (spec.k / (n * spec.d)) * sums[v]!;
    const z = (h - counts[v]! / n) / Math.sqrt(variance[v]!);
    assert.ok(Math.abs(z) <= MANY_Z, `bucket ${v}: z = ${z.toFixed(2)}`);
  }
});

test("loloha memoized over distinct devices: unbiased counts with the pure-protocol variance", () => {
  const spec = new LolohaSpec({ epsilon: 2.0, domain_size: 8 });
  const n = 20_000;
  const ks = keys(new SimulationSource(13), n);
  const rng = new SimulationSource(14);
  const counts = [6000, 4000, 3000, 2500, 2000, 1200, 800, 500];
  const support = new Array<number>(8).fill(0);
  let i = 0;
  counts.forEach((c, v) => {
    for (let r = 0; r < c; r++) {
      const rec = spec.encodeMemoized(v, ks[i++]!, rng);
      const seed = getUint(rec, 0, 4);
      const y = getUint(rec, 4, rec.length - 4);
      for (let u = 0; u < 8; u++) if (hashToRange(u, seed, spec.g) === y) support[u]! += 1;
    }
  });
  const variance = spec.countVariance(counts);
  for (let v = 0; v < 8; v++) {
    const est = (support[v]! - n * spec.qStar) / (spec.pStar - spec.qStar);
    const z = (est - counts[v]!) / Math.sqrt(variance[v]!);
    assert.ok(Math.abs(z) <= MANY_Z, `value ${v}: z = ${z.toFixed(2)}`);
  }
});

test("pem: levels are uniform over devices (χ²) and a report supports its prefix key with probability p", () => {
  const spec = new PEMSpec({ epsilon: 2.0, length: 4, start_bits: 8, step_bits: 4 });
  const n = 30_000;
  const ks = keys(new SimulationSource(15), n);
  const levels = new Array<number>(spec.numLevels).fill(0);
  for (const k of ks) levels[spec.levelForDevice(k)]! += 1;
  const chi = levels.reduce((a, c) => a + (c - n / spec.numLevels) ** 2 / (n / spec.numLevels), 0);
  assert.ok(chi <= chi2Crit(spec.numLevels - 1), `levels: χ² ${chi.toFixed(1)}`);
  const padded = spec.pad("abc");
  const rng = new SimulationSource(16);
  let hits = 0;
  for (let i = 0; i < n; i++) {
    const rec = spec.encodePadded(padded, rng, i % spec.numLevels);
    const key = prefixKey(padded, spec.levelBits(rec[0]!));
    if (getUint(rec, 5, rec.length - 5) === hashToRange(key, getUint(rec, 1, 4), spec.g)) hits++;
  }
  const z = (hits - n * spec.p) / Math.sqrt(n * spec.p * (1 - spec.p));
  assert.ok(Math.abs(z) <= BIAS_Z, `z = ${z.toFixed(2)}`);
});

test("sfp: positions are uniform (χ²) and each sketch keeps its bit with 1 − flip probability at its share of ε", () => {
  const spec = new SFPSpec({ epsilon: 3.0, length: 8, sketch: "hcms", num_hashes: 16, width: 64, word_share: 0.4 });
  const n = 40_000;
  const padded = spec.pad("weather");
  const rng = new SimulationSource(17);
  const positions = new Array<number>(spec.numPositions).fill(0);
  let fKeep = 0;
  let wKeep = 0;
  const f = spec.fragmentSpec;
  const w = spec.wordSpec;
  for (let i = 0; i < n; i++) {
    const rec = spec.encodePadded(padded, rng);
    const pos = rec[0]!;
    positions[pos]! += 1;
    const fragKey = ((spec.wordTag(padded) << 16) | (padded[2 * pos]! << 8) | padded[2 * pos + 1]!) >>> 0;
    if ((parity(f.position(rec[1]!, fragKey) & rec[2]!) ^ rec[3]!) === 0) fKeep++;
    if ((parity(w.position(rec[4]!, spec.wordKey(padded)) & rec[5]!) ^ rec[6]!) === 0) wKeep++;
  }
  const chi = positions.reduce((a, c) => a + (c - n / spec.numPositions) ** 2 / (n / spec.numPositions), 0);
  assert.ok(chi <= chi2Crit(spec.numPositions - 1), `positions: χ² ${chi.toFixed(1)}`);
  for (const [kept, sketch] of [
    [fKeep, f],
    [wKeep, w],
  ] as const) {
    const p = 1 - (sketch as { flipProbability: number }).flipProbability;
    const z = (kept - n * p) / Math.sqrt(n * p * (1 - p));
    assert.ok(Math.abs(z) <= MANY_Z, `${sketch.epsilon}: z = ${z.toFixed(2)}`);
  }
  assert.ok(Math.abs(f.epsilon + w.epsilon - spec.epsilon) < 1e-12);
});
