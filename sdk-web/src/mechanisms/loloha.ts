/**
 * LOLOHA (Arcolezi, Pinzón, Palamidessi and Gambs, EDBT 2023), device side, as
 * ldp_core/mechanisms/loloha.py: a device keeps one hash seed s for life, a memoized permanent GRR
 * over [g] at ε∞ (`epsilon`) per hashed value, and a fresh instantaneous GRR at ε_IRR chosen so one
 * report is exactly ε1-LDP (`epsilon_one`). Record (as OLH): `seed` uint32, `y`.
 *
 * Memoized state is derived from the per-metric key (keystreams labelled
 * `ldp-telemetry/loloha/seed/v1` and `.../prr/v1`), never stored. Draws per memoized report: one
 * float (keep the permanent output?) and one integer below g − 1 (Python's `_grr`, which draws both).
 */
import { SpecError } from "../errors.js";
import { hashToRange } from "../hashing.js";
import type { RandomSource } from "../random.js";
import { MechanismSpec, fromHex, indexSize, packRecord, pureProtocolVariance, requireInt, type Param, type RecordField } from "./base.js";
import { roundHalfEven } from "./olh.js";
import { Keystream, u64le } from "./rappor.js";
import { MemoCache, keystreamIndex } from "./repeated.js";

export const MAX_G = 1024;
const enc = new TextEncoder();
const LABEL_SEED = enc.encode("ldp-telemetry/loloha/seed/v1");
const LABEL_PRR = enc.encode("ldp-telemetry/loloha/prr/v1");

export function irrEpsilon(epsInf: number, epsOne: number, g: number): number {
  if (!(epsOne < epsInf)) throw new SpecError(`loloha: epsilon_one (${epsOne}) must be below epsilon, the permanent ε∞ (${epsInf})`);
  const eInf = Math.exp(epsInf);
  const eOne = Math.exp(epsOne);
  if (!(eInf > eOne)) throw new SpecError(`loloha: epsilon ${epsInf} and epsilon_one ${epsOne} are too close to tell apart`);
  return Math.log((eInf * eOne + (g - 2) * eOne - g + 1) / (eInf - eOne));
}

/** OLOLOHA's g (Arcolezi et al. 2023, Sec. 5), at least 2, at most MAX_G. */
export function optimalG(epsInf: number, epsOne: number): number {
  const a = epsOne / epsInf;
  const e = epsInf;
  const inner = Math.exp(4 * e) - 14 * Math.exp(2 * e) - 12 * Math.exp(2 * e * (a + 1)) + 12 * Math.exp(e * (a + 1)) + 12 * Math.exp(e * (a + 3)) + 1;
  const num = Math.sqrt(Math.max(inner, 0.0)) - Math.exp(2 * e) + 6 * Math.exp(e) - 6 * Math.exp(e * a) + 1;
  const den = 6 * (Math.exp(e) - Math.exp(e * a));
  if (!(den > 0) || !Number.isFinite(num / den)) return 2;
  return Math.trunc(Math.min(MAX_G, Math.max(2, roundHalfEven(num / den))));
}

export class LolohaSpec extends MechanismSpec {
  readonly name = "loloha";
  readonly epsilonOne: number;
  readonly g: number;
  private readonly fields: RecordField[];
  private seedCache: { key: Uint8Array; seed: number } | null = null;
  private readonly memo = new MemoCache<number>();

  constructor(params: { epsilon: number; domain_size: number; epsilon_one?: number | null; g?: number | null }) {
    super("loloha", params.epsilon, params.domain_size);
    const e1 = params.epsilon_one ?? this.epsilon / 2.0;
    if (typeof e1 !== "number") throw new SpecError(`loloha: epsilon_one must be a number, got ${JSON.stringify(e1)}`);
    if (!Number.isFinite(e1) || e1 <= 0 || !(e1 < this.epsilon)) {
      throw new SpecError(`loloha: epsilon_one must be above 0 and below epsilon (the permanent ε∞ = ${this.epsilon}), got ${e1}`);
    }
    this.epsilonOne = e1;
    this.g = params.g === undefined || params.g === null ? optimalG(this.epsilon, e1) : requireInt("loloha", "g", params.g, 2, MAX_G);
    if (!(this.p2 > 0 && this.p2 <= 1)) throw new SpecError("loloha: these epsilons leave no instantaneous randomization");
    this.fields = [
      { name: "seed", kind: "uint", size: 4 },
      { name: "y", kind: "uint", size: indexSize(this.g), bound: this.g },
    ];
  }
  override get memoized(): boolean {
    return true;
  }
  protected ownParams(): [string, Param][] {
    return [
      ["epsilon_one", { value: this.epsilonOne, float: true }],
      ["g", { value: this.g }],
    ];
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  get p1(): number {
    const e = this.expEpsilon;
    return e / (e + this.g - 1);
  }
  get irrEpsilon(): number {
    return irrEpsilon(this.epsilon, this.epsilonOne, this.g);
  }
  get p2(): number {
    const e = Math.exp(this.irrEpsilon);
    return e / (e + this.g - 1);
  }
  get q2(): number {
    return (1.0 - this.p2) / (this.g - 1);
  }
  get pStar(): number {
    return this.p1 * this.p2 + (1.0 - this.p1) * this.q2;
  }
  get qStar(): number {
    return 1.0 / this.g;
  }
  private grr(h: number, p: number, rng: RandomSource): number {
    const keep = rng.float53() < p;
    let other = rng.below(this.g - 1);
    if (other >= h) other += 1;
    return keep ? h : other;
  }
  /** A fresh simulated device: seed, permanent GRR, instantaneous GRR (Python's batch draws). */
  encodeOne(value: number, rng: RandomSource): Uint8Array {
    const v = this.checkValue(value);
    const seed = rng.below(2 ** 32);
    const h = hashToRange(v, seed, this.g);
    return packRecord(this.fields, [seed, this.grr(this.grr(h, this.p1, rng), this.p2, rng)]);
  }
  deviceSeed(key: Uint8Array): number {
    if (this.seedCache && this.seedCache.key === key) return this.seedCache.seed;
    const b = new Keystream(key, LABEL_SEED, fromHex(this.memoDerivationId)).take(4);
    const seed = ((b[0] as number) | ((b[1] as number) << 8) | ((b[2] as number) << 16) | ((b[3] as number) << 24)) >>> 0;
    this.seedCache = { key, seed };
    return seed;
  }
  /** The memoized permanent GRR of hashed value h. */
  permanent(h: number, key: Uint8Array): number {
    const id = fromHex(this.memoDerivationId);
    const ctx = new Uint8Array(id.length + 8);
    ctx.set(id, 0);
    ctx.set(u64le(h), id.length);
    const ks = new Keystream(key, LABEL_PRR, ctx);
    if ((ks.bernoulli(this.p1, 1)[0] as number) & 1) return h;
    const other = keystreamIndex(ks, this.g - 1);
    return other + (other >= h ? 1 : 0);
  }
  /** This device's report: its seed, the memoized permanent output of H_s(value), a fresh instantaneous GRR. */
  encodeMemoized(value: number, key: Uint8Array, rng: RandomSource): Uint8Array {
    if (!(key instanceof Uint8Array) || key.length < 16) throw new SpecError("a memoized encoder needs a device key of at least 16 bytes");
    const v = this.checkValue(value);
    const seed = this.deviceSeed(key);
    const h = hashToRange(v, seed, this.g);
    const perm = this.memo.get(key, h, () => this.permanent(h, key));
    return packRecord(this.fields, [seed, this.grr(perm, this.p2, rng)]);
  }
  countVariance(trueCounts: readonly number[]): number[] {
    return pureProtocolVariance(trueCounts, this.pStar, this.qStar);
  }
}
