/** Binary randomized response (Warner 1965): report the bit with probability e^ε/(1+e^ε). */
import { SpecError } from "../errors.js";
import type { RandomSource } from "../random.js";
import { MechanismSpec, pureProtocolVariance, type Param, type RecordField } from "./base.js";

export class BinaryRRSpec extends MechanismSpec {
  readonly name = "rr";
  private readonly fields: RecordField[] = [{ name: "bit", kind: "uint", size: 1, bound: 2 }];

  constructor(params: { epsilon: number; domain_size?: number }) {
    super("rr", params.epsilon, params.domain_size ?? 2);
    if (this.domainSize !== 2) throw new SpecError(`rr: the domain of binary randomized response is 2, got ${this.domainSize}; use grr`);
  }
  protected ownParams(): [string, Param][] {
    return [];
  }
  get p(): number {
    return this.expEpsilon / (1 + this.expEpsilon);
  }
  get q(): number {
    return 1 / (1 + this.expEpsilon);
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  encodeOne(value: number, rng: RandomSource): Uint8Array {
    const v = this.checkValue(value);
    const flip = rng.float53() >= this.p ? 1 : 0;
    return Uint8Array.of(v ^ flip);
  }
  countVariance(trueCounts: readonly number[]): number[] {
    return pureProtocolVariance(trueCounts, this.p, this.q);
  }
}
