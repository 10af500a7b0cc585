/**
 * Hadamard response (Acharya, Sun and Zhang, AISTATS 2019), basic and block versions, as
 * ldp_core/mechanisms/hr.py: input x uses row r(x) = x mod (b-1) + 1 of H_b in block
 * β(x) = x div (b-1); the output lands in C_x (H_b[r, y] = +1) with probability p.
 */
import { SpecError } from "../errors.js";
import type { RandomSource } from "../random.js";
import { MechanismSpec, indexSize, packRecord, pureProtocolVariance, type Param, type RecordField } from "./base.js";
import { parity } from "./cms.js";

export const MAX_HR_OUTPUTS = 1 << 26;
export const HR_VARIANTS = ["basic", "blocks"] as const;

/** Python's int.bit_length() for 0 <= n < 2**32. */
function bitLength(n: number): number {
  return 32 - Math.clz32(n);
}

export class HRSpec extends MechanismSpec {
  readonly name = "hr";
  readonly variant: "basic" | "blocks";
  readonly numBlocks: number;
  readonly blockSize: number;
  private readonly fields: RecordField[];

  constructor(params: { epsilon: number; domain_size: number; variant?: string }) {
    super("hr", params.epsilon, params.domain_size);
    const variant = params.variant ?? "basic";
    if (variant !== "basic" && variant !== "blocks") throw new SpecError(`hr: variant must be one of basic, blocks, got ${JSON.stringify(variant)}`);
    this.variant = variant;
    if (variant === "basic") this.numBlocks = 1;
    else {
      const target = Math.min(this.expEpsilon, 2 * this.domainSize);
      this.numBlocks = 2 ** (Math.ceil(Math.log2(target)) - 1);
    }
    const perBlock = Math.ceil(this.domainSize / this.numBlocks);
    this.blockSize = 2 ** bitLength(perBlock);
    if (this.outputSize > MAX_HR_OUTPUTS) {
      throw new SpecError(`hr: ${this.outputSize} outputs exceed ${MAX_HR_OUTPUTS}; hash values into a smaller domain or use hcms`);
    }
    this.fields = [{ name: "y", kind: "uint", size: indexSize(this.outputSize), bound: this.outputSize }];
  }
  protected ownParams(): [string, Param][] {
    return [["variant", { value: this.variant }]];
  }
  get outputSize(): number {
    return this.numBlocks * this.blockSize;
  }
  private get baseProbability(): number {
    const b = this.blockSize;
    return 1 / ((b / 2) * this.expEpsilon + this.outputSize - b / 2);
  }
  get p(): number {
    if (this.numBlocks === 1) return this.expEpsilon / (1 + this.expEpsilon);
    return (this.blockSize / 2) * this.expEpsilon * this.baseProbability;
  }
  get blockOutsideProbability(): number {
    if (this.numBlocks === 1) return 1 - this.p;
    return (this.blockSize / 2) * this.baseProbability;
  }
  get gain(): number {
    return this.p - this.blockOutsideProbability;
  }
  blockAndRow(x: number): [number, number] {
    const per = this.blockSize - 1;
    return [Math.floor(x / per), (x % per) + 1];
  }
  /** Whether output `y` is in C_x. */
  supports(x: number, y: number): boolean {
    const [block, row] = this.blockAndRow(x);
    return Math.floor(y / this.blockSize) === block && parity(row & y % this.blockSize) === 0;
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  encodeOne(value: number, rng: RandomSource): Uint8Array {
    const v = this.checkValue(value);
    const b = this.blockSize;
    let [block, row] = this.blockAndRow(v);
    const u = rng.float53();
    let y = rng.below(b);
    const outside = u >= this.p ? 1 : 0;
    let wrong = parity(row & y) !== outside;
    if (this.numBlocks > 1) {
      const own = u < this.p + this.blockOutsideProbability;
      let other = rng.below(this.numBlocks - 1);
      if (other >= block) other += 1;
      if (!own) block = other;
      wrong = wrong && own;
    }
    if (wrong) y ^= row & -row;
    return packRecord(this.fields, [block * b + y]);
  }
  countVariance(trueCounts: readonly number[]): number[] {
    if (this.numBlocks === 1) return pureProtocolVariance(trueCounts, this.p, 0.5);
    const n = trueCounts.reduce((a, c) => a + c, 0);
    const perBlock = new Array<number>(this.numBlocks).fill(0);
    trueCounts.forEach((c, x) => (perBlock[this.blockAndRow(x)[0]] = (perBlock[this.blockAndRow(x)[0]] as number) + c));
    const g = this.gain;
    const a = this.p + this.blockOutsideProbability;
    const c = this.blockSize * this.baseProbability;
    return trueCounts.map((cx, x) => {
      const nb = perBlock[this.blockAndRow(x)[0]] as number;
      return (nb * a + (n - nb) * c - cx * g * g) / (g * g);
    });
  }
}
