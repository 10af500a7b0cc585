/**
 * Optimized unary encoding (Wang et al. 2017, Sec. 4.3): d bits, bit v a fair coin, every other
 * bit 1 with probability q = 1/(e^ε+1). Bits packed little-endian, padding bits 0.
 */
import { bernoulliWords, packBits, probabilityDigits, setBit } from "../bernoulli.js";
import type { RandomSource } from "../random.js";
import { MechanismSpec, pureProtocolVariance, requireInt, type Param, type RecordField } from "./base.js";

export const MAX_OUE_DOMAIN = 1 << 16;

export class OUESpec extends MechanismSpec {
  readonly name = "oue";
  private readonly fields: RecordField[];
  private readonly digits: number[];

  constructor(params: { epsilon: number; domain_size: number }) {
    super("oue", params.epsilon, params.domain_size);
    requireInt("oue", "domain_size", this.domainSize, 2, MAX_OUE_DOMAIN);
    this.fields = [{ name: "bits", kind: "bytes", size: (this.domainSize + 7) >>> 3, nbits: this.domainSize }];
    this.digits = probabilityDigits(this.q);
  }
  protected ownParams(): [string, Param][] {
    return [];
  }
  get p(): number {
    return 0.5;
  }
  get q(): number {
    return 1 / (this.expEpsilon + 1);
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  encodeOne(value: number, rng: RandomSource): Uint8Array {
    const v = this.checkValue(value);
    const words = bernoulliWords(this.q, (this.domainSize + 63) >>> 6, rng, this.digits);
    setBit(words, v, rng.below(2));
    return packBits(words, this.domainSize);
  }
  countVariance(trueCounts: readonly number[]): number[] {
    return pureProtocolVariance(trueCounts, this.p, this.q);
  }
}
