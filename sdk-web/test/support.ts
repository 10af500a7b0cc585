// Test-side estimators and statistics for the TS encoders (the server side lives in Python; these
// are the textbook unbiased estimators, written independently of the encoders).
import { CMSSpec, HCMSSpec, HRSpec, OLHSpec, OUESpec, GRRSpec, BinaryRRSpec, hashToRange, type MechanismSpec } from "../src/index.js";
import { getUint } from "../src/mechanisms/base.js";
import { parity } from "../src/mechanisms/cms.js";

/** Whether report `rec` supports item v, and the pure protocol's (p*, q*); null for sketches. */
export function pureSupport(spec: MechanismSpec): { supports: (rec: Uint8Array, v: number) => boolean; pStar: number; qStar: number } | null {
  if (spec instanceof BinaryRRSpec) return { supports: (r, v) => r[0] === v, pStar: spec.p, qStar: spec.q };
  if (spec instanceof GRRSpec) return { supports: (r, v) => getUint(r, 0, r.length) === v, pStar: spec.p, qStar: spec.q };
  if (spec instanceof OUESpec) return { supports: (r, v) => (((r[v >>> 3] as number) >> (v & 7)) & 1) === 1, pStar: spec.p, qStar: spec.q };
  if (spec instanceof OLHSpec) {
    return { supports: (r, v) => hashToRange(v, getUint(r, 0, 4), spec.g) === getUint(r, 4, r.length - 4), pStar: spec.p, qStar: spec.qStar };
  }
  if (spec instanceof HRSpec && spec.numBlocks === 1) return { supports: (r, v) => spec.supports(v, getUint(r, 0, r.length)), pStar: spec.p, qStar: 0.5 };
  return null;
}

/** Unbiased counts of every item from the reports. */
export function estimateCounts(spec: MechanismSpec, reports: readonly Uint8Array[]): number[] {
  const d = spec.domainSize;
  const n = reports.length;
  const pure = pureSupport(spec);
  if (pure) {
    const c = new Array<number>(d).fill(0);
    for (const r of reports) for (let v = 0; v < d; v++) if (pure.supports(r, v)) c[v]! += 1;
    return c.map((cv) => (cv - n * pure.qStar) / (pure.pStar - pure.qStar));
  }
  if (spec instanceof HRSpec) {
    // F_x = Σ H_b[r(x), y] 1{y in β(x)}, n̂_x = F_x / gain
    const b = spec.blockSize;
    return Array.from({ length: d }, (_, x) => {
      const [block, row] = spec.blockAndRow(x);
      let f = 0;
      for (const r of reports) {
        const y = getUint(r, 0, r.length);
        if (Math.floor(y / b) === block) f += parity(row & y % b) ? -1 : 1;
      }
      return f / spec.gain;
    });
  }
  if (spec instanceof CMSSpec) {
    const m = spec.width;
    const e = Math.exp(spec.epsilon / 2);
    const c = (e + 1) / (e - 1);
    const rs = spec.recordFields[0]!.size;
    return Array.from({ length: d }, (_, x) => {
      let a = 0;
      for (const r of reports) {
        const j = getUint(r, 0, rs);
        const pos = spec.position(j, x);
        const bit = ((r[rs + (pos >>> 3)] as number) >> (pos & 7)) & 1;
        a += (1 - c) / 2 + c * bit;
      }
      return (m / (m - 1)) * (a - n / m);
    });
  }
  if (spec instanceof HCMSSpec) {
    const m = spec.width;
    const c = spec.cEps;
    const fr = spec.recordFields[0]!;
    const fc = spec.recordFields[1]!;
    return Array.from({ length: d }, (_, x) => {
      let a = 0;
      for (const r of reports) {
        const j = getUint(r, 0, fr.size);
        const l = getUint(r, fr.size, fc.size);
        const b = r[fr.size + fc.size] as number;
        const w = b ? -1 : 1;
        const h = parity(spec.position(j, x) & l) ? -1 : 1;
        a += c * w * h;
      }
      return (m / (m - 1)) * (a - n / m);
    });
  }
  throw new Error(`no estimator for ${spec.name}`);
}

/** A fixed population: counts of d items, Zipf-like, summing to n. */
export function population(d: number, n: number): number[] {
  const w = Array.from({ length: d }, (_, i) => 1 / (i + 1));
  const s = w.reduce((a, b) => a + b, 0);
  const counts = w.map((x) => Math.floor((n * x) / s));
  counts[0]! += n - counts.reduce((a, b) => a + b, 0);
  return counts;
}

/** The values of a population, in a shuffled-free order (item v repeated counts[v] times). */
export function valuesOf(counts: readonly number[]): number[] {
  const out: number[] = [];
  counts.forEach((c, v) => {
    for (let i = 0; i < c; i++) out.push(v);
  });
  return out;
}

/** (lower, upper) normal confidence bounds with z standard errors for a binomial proportion k/n. */
export function proportionBounds(k: number, n: number, z: number): [number, number] {
  const p = k / n;
  const se = Math.sqrt(Math.max(p * (1 - p), 1 / n) / n);
  return [Math.max(0, p - z * se), Math.min(1, p + z * se)];
}
