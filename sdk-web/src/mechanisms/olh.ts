/**
 * Optimal local hashing (Wang et al. 2017, Sec. 4.4): a fresh 32-bit seed s, then g-ary randomized
 * response of H_s(x) = reduceRange(XXH32(x, s), g). The draws follow Python's scalar
 * `OLHSpec.encode_one`: the seed, one float, and an integer only when the hash is not kept.
 */
import { hashToRange } from "../hashing.js";
import type { RandomSource } from "../random.js";
import { MechanismSpec, indexSize, packRecord, pureProtocolVariance, requireInt, type Param, type RecordField } from "./base.js";

export const MAX_G = 2 ** 24;

/** Python's round(): to the nearest integer, ties to even. */
export function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const diff = x - f;
  if (diff > 0.5) return f + 1;
  if (diff < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

/** round(e^ε) + 1, capped at MAX_G (client_sdk default_g). */
export function defaultG(epsilon: number): number {
  if (epsilon >= Math.log(MAX_G)) return MAX_G;
  return Math.min(MAX_G, roundHalfEven(Math.exp(epsilon)) + 1);
}

export class OLHSpec extends MechanismSpec {
  readonly name = "olh";
  readonly g: number;
  private readonly fields: RecordField[];

  constructor(params: { epsilon: number; domain_size: number; g?: number | null }) {
    super("olh", params.epsilon, params.domain_size);
    this.g = params.g === undefined || params.g === null ? defaultG(this.epsilon) : requireInt("olh", "g", params.g, 2, MAX_G);
    this.fields = [
      { name: "seed", kind: "uint", size: 4 },
      { name: "y", kind: "uint", size: indexSize(this.g), bound: this.g },
    ];
  }
  protected ownParams(): [string, Param][] {
    return [["g", { value: this.g }]];
  }
  get p(): number {
    return this.expEpsilon / (this.expEpsilon + this.g - 1);
  }
  get qStar(): number {
    return 1 / this.g;
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  encodeOne(value: number, rng: RandomSource): Uint8Array {
    const v = this.checkValue(value);
    const seed = rng.below(2 ** 32);
    const hv = hashToRange(v, seed, this.g);
    let y: number;
    if (rng.float53() < this.p) y = hv;
    else {
      y = rng.below(this.g - 1);
      if (y >= hv) y += 1;
    }
    return packRecord(this.fields, [seed, y]);
  }
  countVariance(trueCounts: readonly number[]): number[] {
    return pureProtocolVariance(trueCounts, this.p, this.qStar);
  }
}
