/**
 * Means of bounded numbers, device side, as ldp_core/mechanisms/numeric.py: Duchi et al.'s
 * mechanism, the Piecewise Mechanism (PM) and the Hybrid Mechanism (HM) of Wang et al.,
 * "Collecting and Analyzing Multidimensional Data with Local Differential Privacy" (ICDE 2019).
 *
 * A value in [low, high] becomes t = 2(v - low)/(high - low) - 1 in [-1, 1]; each mechanism outputs
 * an unbiased t*. Records: Duchi's 1-D record is one byte `bit` (1 = +C); PM's and HM's is `value`,
 * a signed 16-bit t*·32767/C, stochastically rounded. With `dims` > 1 a device samples `sample` (k)
 * attributes (the first k of the argsort of d uniforms), perturbs each at ε/k, and sends `attr` (k
 * bytes, or k uint16) and `value` (k int16) as packed arrays. The draws follow Python's vectorized
 * encoder for one report: every draw of one kind for the k attributes before the next kind.
 */
import { DomainError, SpecError } from "../errors.js";
import type { RandomSource } from "../random.js";
import { ReportSpec, requireInt, type Param, type RecordField } from "./base.js";

export const MAX_DIMS = 4096;
/** The fixed-point scale of a `value` field: t* = value · C / SCALE. */
export const SCALE = 32767;

function requireFinite(spec: string, field: string, v: unknown): number {
  if (typeof v !== "number") throw new SpecError(`${spec}: ${field} must be a number, got ${JSON.stringify(v)}`);
  if (!Number.isFinite(v)) throw new SpecError(`${spec}: ${field} must be finite, got ${v}`);
  return v;
}

/** A number parameter as Python holds it: an int when integral (below 2**53), else a float. */
export function numberParam(v: number): Param {
  return { value: v, float: !(Number.isInteger(v) && Math.abs(v) < 2 ** 53) };
}

/** `n` uniform floats (one numpy `rng.random(n)`). */
export function randoms(rng: RandomSource, n: number): number[] {
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) out[i] = rng.float53();
  return out;
}

export function duchiVariance(t: number, epsilon: number): number {
  const c = (Math.exp(epsilon) + 1.0) / (Math.exp(epsilon) - 1.0);
  return c * c - t * t;
}

export function pmVariance(t: number, epsilon: number): number {
  const h = Math.exp(epsilon / 2.0);
  return (t * t) / (h - 1.0) + (h + 3.0) / (3.0 * (h - 1.0) ** 2);
}

function alphaRaw(epsilon: number): number {
  return 1.0 - Math.exp(-epsilon / 2.0);
}

function mixtureWorst(epsilon: number, alpha: number): number {
  const v0 = alpha * pmVariance(0.0, epsilon) + (1 - alpha) * duchiVariance(0.0, epsilon);
  const v1 = alpha * pmVariance(1.0, epsilon) + (1 - alpha) * duchiVariance(1.0, epsilon);
  return Math.max(v0, v1);
}

/** The ε above which HM mixes in PM (bisection as Python's `_epsilon_star`; ≈ 0.61). */
export const EPSILON_STAR = (() => {
  let lo = 0.05;
  let hi = 3.0;
  const gain = (e: number): number => duchiVariance(0.0, e) - mixtureWorst(e, alphaRaw(e));
  for (let i = 0; i < 100; i++) {
    const mid = (lo + hi) / 2;
    if (gain(mid) > 0) hi = mid;
    else lo = mid;
  }
  return hi;
})();

export function hybridAlpha(epsilon: number): number {
  return epsilon > EPSILON_STAR ? alphaRaw(epsilon) : 0.0;
}

export function hmVariance(t: number, epsilon: number): number {
  const a = hybridAlpha(epsilon);
  return a * pmVariance(t, epsilon) + (1.0 - a) * duchiVariance(t, epsilon);
}

function duchiPerturb(t: readonly number[], epsilon: number, rng: RandomSource): number[] {
  const e = Math.exp(epsilon);
  const c = (e + 1.0) / (e - 1.0);
  const u = randoms(rng, t.length);
  return t.map((x, i) => ((u[i] as number) < 0.5 + (x * (e - 1.0)) / (2.0 * (e + 1.0)) ? c : -c));
}

function pmPerturb(t: readonly number[], epsilon: number, rng: RandomSource): number[] {
  const h = Math.exp(epsilon / 2.0);
  const c = (h + 1.0) / (h - 1.0);
  const centre = randoms(rng, t.length);
  const us = randoms(rng, t.length);
  return t.map((x, i) => {
    const left = ((c + 1.0) / 2.0) * x - (c - 1.0) / 2.0;
    const u = us[i] as number;
    if ((centre[i] as number) < h / (h + 1.0)) return left + u * (c - 1.0);
    const s = u * (c + 1.0);
    const lowLen = left + c;
    return s < lowLen ? -c + s : left + (c - 1.0) + (s - lowLen);
  });
}

function hmPerturb(t: readonly number[], epsilon: number, rng: RandomSource): number[] {
  const usePm = randoms(rng, t.length);
  const pm = pmPerturb(t, epsilon, rng);
  const d = duchiPerturb(t, epsilon, rng);
  const a = hybridAlpha(epsilon);
  return t.map((_, i) => ((usePm[i] as number) < a ? (pm[i] as number) : (d[i] as number)));
}

/** Int16 values (two's complement) packed little-endian. */
function packInt16(values: readonly number[], out: Uint8Array, offset: number): void {
  values.forEach((v, i) => {
    const u = v < 0 ? v + 65536 : v;
    out[offset + 2 * i] = u & 0xff;
    out[offset + 2 * i + 1] = (u >>> 8) & 0xff;
  });
}

/** A spec over a bounded number: values in [low, high] (Python's `NumericSpec`). */
export abstract class NumericSpec extends ReportSpec {
  readonly low: number;
  readonly high: number;

  protected constructor(name: string, params: { epsilon: number; low: number; high: number }) {
    super(name, params.epsilon);
    this.low = requireFinite(name, "low", params.low);
    this.high = requireFinite(name, "high", params.high);
    if (!(this.low < this.high)) throw new SpecError(`${name}: low (${this.low}) must be below high (${this.high})`);
  }

  override get kind(): string {
    return "mean";
  }

  get halfWidth(): number {
    return (this.high - this.low) / 2.0;
  }

  protected rangeParams(): [string, Param][] {
    return [
      ["low", numberParam(this.low)],
      ["high", numberParam(this.high)],
    ];
  }

  /** `v` (finite, within [low, high]) as t in [-1, 1]; DomainError otherwise. */
  normalize(v: unknown): number {
    if (typeof v !== "number" || !Number.isFinite(v)) throw new DomainError(`${this.name}: values must be finite numbers, got ${String(v)}`);
    if (v < this.low || v > this.high) throw new DomainError(`${this.name}: value ${v} is outside [${this.low}, ${this.high}]`);
    return Math.min(1.0, Math.max(-1.0, (v - this.low) / this.halfWidth - 1.0));
  }

  /** Privatize one value (a number, or `dims` numbers) into one record's bytes. */
  abstract encodeNumber(value: number | readonly number[], rng: RandomSource): Uint8Array;
}

type MeanParams = { epsilon: number; low: number; high: number; dims?: number; sample?: number | null };

/** The three mean mechanisms: `dims` attributes, `sample` of them per report. */
export abstract class MeanSpec extends NumericSpec {
  readonly dims: number;
  readonly sample: number;
  private readonly fields: RecordField[];

  protected constructor(name: string, params: MeanParams) {
    super(name, params);
    this.dims = requireInt(name, "dims", params.dims ?? 1, 1, MAX_DIMS);
    if (this.dims === 1) {
      if (params.sample !== undefined && params.sample !== null && params.sample !== 1) {
        throw new SpecError(`${name}: sample must be 1 (or omitted) for one attribute, got ${JSON.stringify(params.sample)}`);
      }
      this.sample = 1;
    } else {
      const k = params.sample ?? Math.max(1, Math.min(this.dims, Math.floor(this.epsilon / 2.5)));
      this.sample = requireInt(name, "sample", k, 1, this.dims);
    }
    const attr = this.dims <= 256 ? 1 : 2;
    this.fields =
      this.dims === 1
        ? this.oneDimFields()
        : [
            { name: "attr", kind: "bytes", size: attr * this.sample },
            { name: "value", kind: "bytes", size: 2 * this.sample },
          ];
  }

  protected oneDimFields(): RecordField[] {
    return [{ name: "value", kind: "uint", size: 2, signed: true, min: -SCALE }];
  }

  protected ownParams(): [string, Param][] {
    return [...this.rangeParams(), ["dims", { value: this.dims }], ["sample", { value: this.sample }]];
  }

  get k(): number {
    return this.sample;
  }

  /** ε/k: the ε of each perturbed attribute. */
  get epsilonEach(): number {
    return this.epsilon / this.k;
  }

  get recordFields(): readonly RecordField[] {
    return this.fields;
  }

  /** The largest |t*| a report may carry (at ε/k). */
  abstract outputBound(): number;
  protected abstract perturb(t: readonly number[], epsilon: number, rng: RandomSource): number[];
  /** Var[t*] of one perturbed attribute at ε/k. */
  abstract outputVariance(t: number): number;

  /** Variance of one user's summand y_j (normalized units). */
  summandVariance(t: number): number {
    if (this.dims === 1) return this.outputVariance(t);
    const r = this.dims / this.k;
    return r * (this.outputVariance(t) + t * t) - t * t;
  }

  worstCaseVariance(): number {
    return Math.max(this.summandVariance(0.0), this.summandVariance(1.0));
  }

  /** t* of a record (normalized units): one number, or the k sampled attributes' [attr, t*] pairs. */
  tStarOf(rec: Uint8Array): number {
    const v = rec[0]! | (rec[1]! << 8);
    return (v >= 32768 ? v - 65536 : v) * (this.outputBound() / SCALE);
  }

  private rounded(tStar: readonly number[], rng: RandomSource): number[] {
    const scale = SCALE / this.outputBound();
    const xs = tStar.map((x) => x * scale);
    const u = randoms(rng, xs.length);
    return xs.map((x, i) => {
      const low = Math.floor(x);
      const r = low + ((u[i] as number) < x - low ? 1 : 0);
      return Math.min(SCALE, Math.max(-SCALE, r));
    });
  }

  override encodeNumber(value: number | readonly number[], rng: RandomSource): Uint8Array {
    if (this.dims === 1) {
      if (typeof value !== "number") throw new DomainError(`${this.name}: this metric takes one number`);
      const t = this.normalize(value);
      const out = new Uint8Array(2);
      packInt16(this.rounded(this.perturb([t], this.epsilon, rng), rng), out, 0);
      return out;
    }
    if (!Array.isArray(value) || value.length !== this.dims) throw new DomainError(`${this.name}: values must be ${this.dims} numbers`);
    const t = (value as readonly number[]).map((v) => this.normalize(v));
    const d = this.dims;
    const k = this.k;
    let attrs: number[];
    if (k < d) {
      const u = randoms(rng, d);
      attrs = Array.from({ length: d }, (_, i) => i)
        .sort((a, b) => (u[a] as number) - (u[b] as number) || a - b)
        .slice(0, k);
    } else attrs = Array.from({ length: d }, (_, i) => i);
    const picked = attrs.map((a) => t[a] as number);
    const vals = this.rounded(this.perturb(picked, this.epsilonEach, rng), rng);
    const size = d <= 256 ? 1 : 2;
    const out = new Uint8Array(size * k + 2 * k);
    attrs.forEach((a, i) => {
      out[size * i] = a & 0xff;
      if (size === 2) out[size * i + 1] = a >>> 8;
    });
    packInt16(vals, out, size * k);
    return out;
  }
}

export class DuchiSpec extends MeanSpec {
  readonly name = "duchi";
  constructor(params: MeanParams) {
    super("duchi", params);
  }
  protected override oneDimFields(): RecordField[] {
    return [{ name: "bit", kind: "uint", size: 1, bound: 2 }];
  }
  outputBound(): number {
    const e = Math.exp(this.epsilonEach);
    return (e + 1.0) / (e - 1.0);
  }
  outputVariance(t: number): number {
    return duchiVariance(t, this.epsilonEach);
  }
  protected perturb(t: readonly number[], epsilon: number, rng: RandomSource): number[] {
    return duchiPerturb(t, epsilon, rng);
  }
  override tStarOf(rec: Uint8Array): number {
    if (this.dims > 1) return super.tStarOf(rec);
    return rec[0] === 1 ? this.outputBound() : -this.outputBound();
  }
  override encodeNumber(value: number | readonly number[], rng: RandomSource): Uint8Array {
    if (this.dims > 1) return super.encodeNumber(value, rng);
    if (typeof value !== "number") throw new DomainError(`${this.name}: this metric takes one number`);
    const t = this.normalize(value);
    const e = Math.exp(this.epsilon);
    return Uint8Array.of(rng.float53() < 0.5 + (t * (e - 1.0)) / (2.0 * (e + 1.0)) ? 1 : 0);
  }
}

export class PiecewiseSpec extends MeanSpec {
  readonly name = "pm";
  constructor(params: MeanParams) {
    super("pm", params);
  }
  outputBound(): number {
    const h = Math.exp(this.epsilonEach / 2.0);
    return (h + 1.0) / (h - 1.0);
  }
  outputVariance(t: number): number {
    return pmVariance(t, this.epsilonEach);
  }
  protected perturb(t: readonly number[], epsilon: number, rng: RandomSource): number[] {
    return pmPerturb(t, epsilon, rng);
  }
}

export class HybridSpec extends MeanSpec {
  readonly name = "hm";
  constructor(params: MeanParams) {
    super("hm", params);
  }
  outputBound(): number {
    const e = this.epsilonEach;
    const d = (Math.exp(e) + 1.0) / (Math.exp(e) - 1.0);
    const h = Math.exp(e / 2.0);
    return hybridAlpha(e) > 0 ? Math.max(d, (h + 1.0) / (h - 1.0)) : d;
  }
  outputVariance(t: number): number {
    return hmVariance(t, this.epsilonEach);
  }
  protected perturb(t: readonly number[], epsilon: number, rng: RandomSource): number[] {
    return hmPerturb(t, epsilon, rng);
  }
}

/** The mean mechanism with the lowest worst-case variance at ε (ties: duchi, hm, pm), as Python's `best_mean_mechanism`. */
export function bestMeanMechanism(epsilon: number, dims = 1, sample: number | null = null): string {
  const p = { epsilon, low: -1, high: 1, dims, sample };
  const worst: [string, number][] = [
    ["duchi", new DuchiSpec(p).worstCaseVariance()],
    ["hm", new HybridSpec(p).worstCaseVariance()],
    ["pm", new PiecewiseSpec(p).worstCaseVariance()],
  ];
  let best = worst[0] as [string, number];
  for (const w of worst) if (w[1] < best[1]) best = w;
  return best[0];
}
