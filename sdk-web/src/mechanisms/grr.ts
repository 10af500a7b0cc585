/** k-ary randomized response (direct encoding): keep v with p = e^ε/(e^ε+d-1), else another value uniformly. */
import type { RandomSource } from "../random.js";
import { MechanismSpec, indexSize, packRecord, pureProtocolVariance, type Param, type RecordField } from "./base.js";

export class GRRSpec extends MechanismSpec {
  readonly name = "grr";
  private readonly fields: RecordField[];

  constructor(params: { epsilon: number; domain_size: number }) {
    super("grr", params.epsilon, params.domain_size);
    this.fields = [{ name: "value", kind: "uint", size: indexSize(this.domainSize), bound: this.domainSize }];
  }
  protected ownParams(): [string, Param][] {
    return [];
  }
  get p(): number {
    return this.expEpsilon / (this.expEpsilon + this.domainSize - 1);
  }
  get q(): number {
    return 1 / (this.expEpsilon + this.domainSize - 1);
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  encodeOne(value: number, rng: RandomSource): Uint8Array {
    const v = this.checkValue(value);
    const keep = rng.float53() < this.p;
    let other = rng.below(this.domainSize - 1);
    if (other >= v) other += 1;
    return packRecord(this.fields, [keep ? v : other]);
  }
  countVariance(trueCounts: readonly number[]): number[] {
    return pureProtocolVariance(trueCounts, this.p, this.q);
  }
}
