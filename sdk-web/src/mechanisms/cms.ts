/**
 * Count Mean Sketch and Hadamard Count Mean Sketch (Apple 2017, A_client-CMS / A_client-HCMS),
 * as ldp_core/mechanisms/cms.py: k hashes h_j(x) = reduceRange(XXH32(x, seed_j), m) with
 * seed_j = XXH32(j, hash_seed).
 */
import { bernoulliWords, getBit, packBits, probabilityDigits, setBit } from "../bernoulli.js";
import { SpecError } from "../errors.js";
import { hashToRange, xxh32U32 } from "../hashing.js";
import type { RandomSource } from "../random.js";
import { MechanismSpec, indexSize, packRecord, requireInt, type Param, type RecordField } from "./base.js";

export const MAX_SKETCH_CELLS = 1 << 24;
const MAX_HASHES = 1 << 16;
const MAX_WIDTH = 1 << 16;

/** The parity (popcount mod 2) of a 32-bit value. */
export function parity(x: number): number {
  let v = x >>> 0;
  v ^= v >>> 16;
  v ^= v >>> 8;
  v ^= v >>> 4;
  return (0x6996 >>> (v & 0xf)) & 1;
}

interface SketchParams {
  epsilon: number;
  domain_size: number;
  num_hashes?: number;
  width?: number;
  hash_seed?: number;
}

abstract class SketchSpec extends MechanismSpec {
  readonly numHashes: number;
  readonly width: number;
  readonly hashSeed: number;
  readonly rowSeeds: Uint32Array;

  protected constructor(name: string, params: SketchParams) {
    super(name, params.epsilon, params.domain_size);
    const k = requireInt(name, "num_hashes", params.num_hashes ?? 256, 1, MAX_HASHES);
    const m = requireInt(name, "width", params.width ?? 1024, 2, MAX_WIDTH);
    const s = requireInt(name, "hash_seed", params.hash_seed ?? 0, 0, 2 ** 32 - 1);
    if (k * m > MAX_SKETCH_CELLS) {
      throw new SpecError(`${name}: num_hashes*width = ${k}*${m} = ${k * m} exceeds ${MAX_SKETCH_CELLS} sketch cells; lower num_hashes or width`);
    }
    this.numHashes = k;
    this.width = m;
    this.hashSeed = s;
    this.rowSeeds = new Uint32Array(k);
    for (let j = 0; j < k; j++) this.rowSeeds[j] = xxh32U32(j, s);
  }
  protected ownParams(): [string, Param][] {
    return [
      ["num_hashes", { value: this.numHashes }],
      ["width", { value: this.width }],
      ["hash_seed", { value: this.hashSeed }],
    ];
  }
  /** h_j(x). */
  position(row: number, x: number): number {
    return hashToRange(x, this.rowSeeds[row] as number, this.width);
  }
  /** Σ_{x≠d} n_x² (m-1)/(k m²) for each d, and the other shared terms. */
  protected terms(trueCounts: readonly number[]): { n: number; others: number[]; othersSq: number[] } {
    const n = trueCounts.reduce((a, b) => a + b, 0);
    const sq = trueCounts.reduce((a, b) => a + b * b, 0);
    return { n, others: trueCounts.map((c) => n - c), othersSq: trueCounts.map((c) => sq - c * c) };
  }
}

export class CMSSpec extends SketchSpec {
  readonly name = "cms";
  private readonly fields: RecordField[];
  private readonly digits: number[];

  constructor(params: SketchParams) {
    super("cms", params);
    this.fields = [
      { name: "row", kind: "uint", size: indexSize(this.numHashes), bound: this.numHashes },
      { name: "bits", kind: "bytes", size: (this.width + 7) >>> 3, nbits: this.width },
    ];
    this.digits = probabilityDigits(this.flipProbability);
  }
  /** 1/(1 + e^{ε/2}). */
  get flipProbability(): number {
    return 1 / (1 + Math.exp(this.epsilon / 2));
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  encodeOne(value: number, rng: RandomSource): Uint8Array {
    const v = this.checkValue(value);
    const row = rng.below(this.numHashes);
    const pos = this.position(row, v);
    const flips = bernoulliWords(this.flipProbability, (this.width + 63) >>> 6, rng, this.digits);
    setBit(flips, pos, getBit(flips, pos) ^ 1);
    return packRecord(this.fields, [row, packBits(flips, this.width)]);
  }
  /** Exact variance over the device noise and a random hash family (client_sdk CMSSpec.count_variance). */
  countVariance(trueCounts: readonly number[]): number[] {
    const { n, others, othersSq } = this.terms(trueCounts);
    const m = this.width;
    const k = this.numHashes;
    const e = Math.exp(this.epsilon / 2);
    return trueCounts.map((_, i) => {
      const varA = (n * e) / (e - 1) ** 2 + ((others[i] as number) * (m - 1) * (k - 1)) / (k * m * m) + ((othersSq[i] as number) * (m - 1)) / (k * m * m);
      return (m / (m - 1)) ** 2 * varA;
    });
  }
}

export class HCMSSpec extends SketchSpec {
  readonly name = "hcms";
  private readonly fields: RecordField[];

  constructor(params: SketchParams) {
    super("hcms", params);
    if (this.width & (this.width - 1)) throw new SpecError(`hcms: width must be a power of two (Hadamard size), got ${this.width}; try 1024`);
    this.fields = [
      { name: "row", kind: "uint", size: indexSize(this.numHashes), bound: this.numHashes },
      { name: "col", kind: "uint", size: indexSize(this.width), bound: this.width },
      { name: "bit", kind: "uint", size: 1, bound: 2 },
    ];
  }
  get flipProbability(): number {
    return 1 / (1 + this.expEpsilon);
  }
  get cEps(): number {
    return (this.expEpsilon + 1) / (this.expEpsilon - 1);
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  encodeOne(value: number, rng: RandomSource): Uint8Array {
    const v = this.checkValue(value);
    const row = rng.below(this.numHashes);
    const col = rng.below(this.width);
    const flip = rng.float53() < this.flipProbability ? 1 : 0;
    const pos = this.position(row, v);
    return packRecord(this.fields, [row, col, parity(pos & col) ^ flip]);
  }
  countVariance(trueCounts: readonly number[]): number[] {
    const { n, others, othersSq } = this.terms(trueCounts);
    const m = this.width;
    const k = this.numHashes;
    const ce = this.cEps;
    return trueCounts.map((c, i) => {
      const varA = n * ce * ce - c - (others[i] as number) * (1 / (m * m) + (m - 1) / (k * m * m)) + ((othersSq[i] as number) * (m - 1)) / (k * m * m);
      return (m / (m - 1)) ** 2 * varA;
    });
  }
}
