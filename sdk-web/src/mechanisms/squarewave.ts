/**
 * Square Wave (Li et al., "Estimating Numerical Distributions under Local Differential Privacy",
 * SIGMOD 2020), discretized on the device as ldp_core/mechanisms/square_wave.py: the value moves to
 * the centre c of its input bin (of `bins` over [0, 1]), ṽ is drawn with density p within b of c and
 * q elsewhere on [-b, 1 + b], and only ṽ's output bin (of `out_bins`) is reported. Draws: one float
 * (near or not), one float (where).
 */
import { SpecError } from "../errors.js";
import type { RandomSource } from "../random.js";
import { indexSize, requireInt, type Param, type RecordField } from "./base.js";
import { NumericSpec } from "./numeric.js";

export const MAX_BINS = 1 << 16;

/** b = (ε e^ε − e^ε + 1) / (2 e^ε (e^ε − 1 − ε)); 1/2 below ε = 1e-4. */
export function squareWaveB(epsilon: number): number {
  const e = Math.exp(epsilon);
  if (epsilon < 1e-4) return 0.5;
  return (epsilon * e - e + 1.0) / (2.0 * e * (e - 1.0 - epsilon));
}

export class SquareWaveSpec extends NumericSpec {
  readonly name = "sw";
  readonly bins: number;
  readonly outBins: number;
  private readonly fields: RecordField[];

  constructor(params: { epsilon: number; low: number; high: number; bins?: number; out_bins?: number | null }) {
    super("sw", params);
    this.bins = requireInt("sw", "bins", params.bins ?? 256, 2, MAX_BINS);
    const ob = params.out_bins ?? Math.ceil((1.0 + 2.0 * this.b) * this.bins - 1e-9);
    this.outBins = requireInt("sw", "out_bins", ob, 2, 4 * MAX_BINS);
    if (this.b <= 0) throw new SpecError(`sw: epsilon ${this.epsilon} gives no square wave width`);
    this.fields = [{ name: "bin", kind: "uint", size: indexSize(this.outBins), bound: this.outBins }];
  }
  override get kind(): string {
    return "distribution";
  }
  protected ownParams(): [string, Param][] {
    return [...this.rangeParams(), ["bins", { value: this.bins }], ["out_bins", { value: this.outBins }]];
  }
  get b(): number {
    return squareWaveB(this.epsilon);
  }
  get p(): number {
    return Math.exp(this.epsilon) / (2.0 * this.b * Math.exp(this.epsilon) + 1.0);
  }
  get q(): number {
    return 1.0 / (2.0 * this.b * Math.exp(this.epsilon) + 1.0);
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  /** The input bin of a value in [low, high] (high in the last). */
  inputBin(value: number): number {
    const t = (this.normalize(value) + 1.0) / 2.0;
    return Math.min(Math.floor(t * this.bins), this.bins - 1);
  }
  encodeNumber(value: number | readonly number[], rng: RandomSource): Uint8Array {
    const i = this.inputBin(value as number);
    const c = (i + 0.5) / this.bins;
    const b = this.b;
    const near = rng.float53() < 2.0 * b * this.p;
    const u = rng.float53();
    const v = near ? c - b + u * 2.0 * b : u < c ? -b + u : c + b + (u - c);
    const j = Math.min(this.outBins - 1, Math.max(0, Math.floor(((v + b) / (1.0 + 2.0 * b)) * this.outBins)));
    const out = new Uint8Array(this.fields[0]!.size);
    for (let k = 0; k < out.length; k++) out[k] = Math.floor(j / 2 ** (8 * k)) & 0xff;
    return out;
  }
  /** M[j][i] = P[report j | input bin i] (as Python's `transition_matrix`). */
  transitionProbability(j: number, i: number): number {
    const b = this.b;
    const w = (1.0 + 2.0 * b) / this.outBins;
    const lo = -b + j * w;
    const hi = -b + (j + 1) * w;
    const c = (i + 0.5) / this.bins;
    const overlap = Math.max(0, Math.min(hi, c + b) - Math.max(lo, c - b));
    return this.q * (hi - lo) + (this.p - this.q) * overlap;
  }
}
