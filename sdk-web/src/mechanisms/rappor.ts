/**
 * RAPPOR (Erlingsson, Pihur and Korolova, CCS 2014), device side, as ldp_core/mechanisms/rappor.py.
 *
 * A value x of cohort c sets the Bloom bits reduceRange(XXH32(x, seed_{c,i}), k),
 * seed_{c,i} = XXH32(c·h + i, hash_seed). The permanent randomized response (PRR) keeps each bit
 * with probability 1 - f and sets it to a fair coin otherwise, f = 2/(1 + e^{ε∞/(2h)}); the
 * instantaneous one (IRR) reports 1 with probability q over a PRR 1 and p over a 0.
 *
 * **Memoized** ({@link RapporSpec.encodeMemoized}, what the client uses): the device's cohort and
 * each value's PRR are pure functions of a per-metric key, derived with an HMAC-SHA256 keystream
 * (key, label ‖ 0x00 ‖ memo derivation id ‖ [value int64 LE] ‖ counter uint64 LE), so the same
 * (key, spec, value) always has the same permanent bits and nothing is stored; the IRR is fresh.
 * The per-metric key is keyed BLAKE2b of `metric ‖ 0x00 ‖ memo derivation id` under the 32-byte device
 * secret (personalization "ldp-prr-v1"), as client_sdk/memo.py.
 *
 * {@link RapporSpec.encodeOne} is the batch encoder of simulations: a fresh cohort and PRR per
 * report (one distinct user each), drawn in one stage: Bernoulli(p*) off the filter, q* on it.
 */
import { blake2b } from "@noble/hashes/blake2.js";
import { hmac } from "@noble/hashes/hmac.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { bernoulliWords, packBits, probabilityDigits, setBit, getBit } from "../bernoulli.js";
import { DomainError, SpecError } from "../errors.js";
import { hashToRange, utf8, xxh32U32 } from "../hashing.js";
import type { RandomSource } from "../random.js";
import { MechanismSpec, fromHex, hex, packRecord, requireInt, type Param, type RecordField } from "./base.js";

export const MAX_BITS = 8192;
export const MAX_COHORTS = 1 << 16;
export const MAX_HASHES = 64;
export const MIN_SECRET_BYTES = 16;
const LABEL_PRR = utf8("ldp-telemetry/rappor/prr/v1");
const LABEL_COHORT = utf8("ldp-telemetry/rappor/cohort/v1");
const PERSON = utf8("ldp-prr-v1");

export function defaultNumBits(d: number): number {
  return Math.min(4096, Math.max(16, 8 * Math.ceil(d / 8)));
}

export function defaultNumCohorts(d: number, k: number): number {
  return Math.max(8, Math.ceil((8 * d) / k));
}

export function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((a, p) => a + p.length, 0));
  let off = 0;
  for (const p of parts) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

export function u64le(n: number | bigint): Uint8Array {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt.asUintN(64, BigInt(n)), true);
  return out;
}

/** HMAC-SHA256(key, prefix ‖ counter) for counter = 0, 1, ..., read as one byte stream. */
export class Keystream {
  private counter = 0;
  private buf: Uint8Array = new Uint8Array(0);
  private readonly prefix: Uint8Array;
  constructor(
    private readonly key: Uint8Array,
    label: Uint8Array,
    context: Uint8Array,
  ) {
    this.prefix = concat(label, Uint8Array.of(0), context);
  }
  take(n: number): Uint8Array {
    while (this.buf.length < n) {
      const block = hmac(sha256, this.key, concat(this.prefix, u64le(this.counter)));
      this.buf = concat(this.buf, block);
      this.counter++;
    }
    const out = this.buf.slice(0, n);
    this.buf = this.buf.slice(n);
    return out;
  }
  /** `nbits` uniform bits, little-endian in bytes, bits above nbits cleared. */
  bits(nbits: number): Uint8Array {
    const out = this.take((nbits + 7) >>> 3);
    if (nbits % 8) out[out.length - 1] = (out[out.length - 1] as number) & ((1 << (nbits % 8)) - 1);
    return out;
  }
  /** `nbits` independent Bernoulli(prob) bits by the exact bit-sliced comparison (as Python's `_Keystream.bernoulli`). */
  bernoulli(prob: number, nbits: number): Uint8Array {
    const n = (nbits + 7) >>> 3;
    const ones = (): Uint8Array => {
      const o = new Uint8Array(n).fill(0xff);
      if (nbits % 8) o[n - 1] = (1 << (nbits % 8)) - 1;
      return o;
    };
    if (prob >= 1) return ones();
    const undecided = ones();
    const result = new Uint8Array(n);
    for (const digit of probabilityDigits(prob)) {
      if (undecided.every((b) => b === 0)) break;
      const u = this.bits(nbits);
      for (let i = 0; i < n; i++) {
        const und = undecided[i] as number;
        const w = u[i] as number;
        if (digit) {
          result[i] = (result[i] as number) | (und & ~w & 0xff);
          undecided[i] = und & w;
        } else undecided[i] = und & ~w & 0xff;
      }
    }
    return result;
  }
}

export interface RapporParams {
  epsilon: number;
  domain_size: number;
  num_bits?: number | null;
  num_hashes?: number;
  num_cohorts?: number | null;
  p?: number;
  q?: number;
  hash_seed?: number;
}

function probability(field: string, v: unknown): number {
  if (typeof v !== "number") throw new SpecError(`rappor: ${field} must be a probability, got ${JSON.stringify(v)}`);
  if (!(v >= 0 && v <= 1)) throw new SpecError(`rappor: ${field} must be in [0, 1], got ${v}`);
  return v;
}

export class RapporSpec extends MechanismSpec {
  readonly name = "rappor";
  override get memoized(): boolean {
    return true;
  }
  readonly numBits: number;
  readonly numHashes: number;
  readonly numCohorts: number;
  readonly p: number;
  readonly q: number;
  readonly hashSeed: number;
  /** seed[c·h + i] */
  readonly cohortSeeds: Uint32Array;
  private readonly fields: RecordField[];
  private readonly cohorts = new Map<string, number>();
  /** Memoized permanent responses (a pure function of key and value; in memory only, at most PRR_CACHE). */
  private readonly prrCache = new Map<string, Uint8Array>();
  static readonly PRR_CACHE = 1024;

  constructor(params: RapporParams) {
    super("rappor", params.epsilon, params.domain_size);
    const d = this.domainSize;
    const k = params.num_bits == null ? defaultNumBits(d) : requireInt("rappor", "num_bits", params.num_bits, 1, MAX_BITS);
    const h = requireInt("rappor", "num_hashes", params.num_hashes ?? 2, 1, Math.min(MAX_HASHES, k));
    let m: number;
    if (params.num_cohorts == null) {
      m = defaultNumCohorts(d, k);
      if (m > MAX_COHORTS) throw new SpecError(`rappor: a domain of ${d} values needs num_bits*num_cohorts >= ${d}; set both explicitly`);
    } else m = requireInt("rappor", "num_cohorts", params.num_cohorts, 1, MAX_COHORTS);
    const s = requireInt("rappor", "hash_seed", params.hash_seed ?? 0, 0, 2 ** 32 - 1);
    const p = probability("p", params.p ?? 0.5);
    const q = probability("q", params.q ?? 0.75);
    if (!(p < q)) {
      throw new SpecError(`rappor: the IRR needs p < q (p = P[1 | PRR bit 0], q = P[1 | PRR bit 1]), got p=${p}, q=${q}; the paper's values are p=0.5, q=0.75`);
    }
    if (d > m * k) {
      throw new SpecError(`rappor: ${d} values cannot be told apart by least squares from ${m} cohorts x ${k} bits (needs domain_size <= num_cohorts*num_bits = ${m * k}); raise num_bits or num_cohorts`);
    }
    this.numBits = k;
    this.numHashes = h;
    this.numCohorts = m;
    this.hashSeed = s;
    this.p = p;
    this.q = q;
    if (!(this.f > 0 && this.f < 1) || this.qStar === this.pStar) throw new SpecError(`rappor: epsilon ${this.epsilon} with num_hashes ${h} leaves no signal; raise epsilon`);
    this.cohortSeeds = new Uint32Array(m * h);
    for (let i = 0; i < m * h; i++) this.cohortSeeds[i] = xxh32U32(i, s);
    this.fields = [
      { name: "cohort", kind: "uint", size: 2, bound: m },
      { name: "bits", kind: "bytes", size: (k + 7) >>> 3, nbits: k },
    ];
  }
  protected ownParams(): [string, Param][] {
    return [
      ["num_bits", { value: this.numBits }],
      ["num_hashes", { value: this.numHashes }],
      ["num_cohorts", { value: this.numCohorts }],
      ["p", { value: this.p, float: true }],
      ["q", { value: this.q, float: true }],
      ["hash_seed", { value: this.hashSeed }],
    ];
  }
  /** PRR noise f = 2/(1 + e^{ε∞/(2h)}). */
  get f(): number {
    return 2 / (1 + Math.exp(this.epsilon / (2 * this.numHashes)));
  }
  /** P[report bit = 1 | filter bit = 1]. */
  get qStar(): number {
    const half = this.f / 2;
    return (1 - half) * this.q + half * this.p;
  }
  /** P[report bit = 1 | filter bit = 0]. */
  get pStar(): number {
    const half = this.f / 2;
    return half * this.q + (1 - half) * this.p;
  }
  /** Per-bit ε of the IRR alone, ln(q(1-p)/(p(1-q))) (infinite without an IRR). */
  get irrEpsilon(): number {
    if (this.p <= 0 || this.q >= 1) return Infinity;
    return Math.log((this.q * (1 - this.p)) / (this.p * (1 - this.q)));
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  /** The Bloom bit positions of `value` in `cohort` (with repeats). */
  bloomPositions(value: number, cohort: number): number[] {
    const out: number[] = [];
    for (let i = 0; i < this.numHashes; i++) out.push(hashToRange(value, this.cohortSeeds[cohort * this.numHashes + i] as number, this.numBits));
    return out;
  }

  private bernoulli(prob: number, nWords: number, rng: RandomSource): Uint32Array {
    if (prob >= 1) return new Uint32Array(2 * nWords).fill(0xffffffff);
    return bernoulliWords(prob, nWords, rng);
  }

  private get nWords(): number {
    return (this.numBits + 63) >>> 6;
  }

  /** One simulated distinct user's report: a uniform cohort and a fresh PRR and IRR (one stage). */
  encodeOne(value: number, rng: RandomSource): Uint8Array {
    const v = this.checkValue(value);
    const h = this.numHashes;
    const cohort = rng.below(this.numCohorts);
    const pos = this.bloomPositions(v, cohort);
    const words = this.bernoulli(this.pStar, this.nWords, rng);
    const on = this.bernoulli(this.qStar, (h + 63) >>> 6, rng);
    for (let i = 0; i < h; i++) setBit(words, pos[i] as number, getBit(on, i));
    return packRecord(this.fields, [cohort, packBits(words, this.numBits)]);
  }

  /** The per-metric key: BLAKE2b-256(key = device secret, `metric ‖ 0x00 ‖ spec id`, person "ldp-prr-v1"). */
  static metricSecret(deviceSecret: Uint8Array, metric: string, specId: string): Uint8Array {
    if (deviceSecret.length !== 32) throw new DomainError("the device secret must be 32 bytes");
    const personalization = new Uint8Array(16);
    personalization.set(PERSON);
    return blake2b(utf8(`${metric}\u0000${specId}`), { key: deviceSecret, dkLen: 32, personalization });
  }

  private static asSecret(secret: Uint8Array): Uint8Array {
    if (!(secret instanceof Uint8Array)) throw new DomainError("rappor: the device secret must be bytes");
    if (secret.length < MIN_SECRET_BYTES) {
      throw new DomainError(`rappor: the device secret has ${secret.length} bytes; use at least ${MIN_SECRET_BYTES} bytes from a CSPRNG and keep it on the device`);
    }
    return secret;
  }

  /** The device's cohort for `secret`: the first keystream word below 2^64 - (2^64 mod m), mod m. */
  cohortOf(secret: Uint8Array): number {
    const key = RapporSpec.asSecret(secret);
    const memo = hex(key);
    const hit = this.cohorts.get(memo);
    if (hit !== undefined) return hit;
    const ks = new Keystream(key, LABEL_COHORT, fromHex(this.memoDerivationId));
    const m = BigInt(this.numCohorts);
    const two64 = 1n << 64n;
    const limit = two64 - (two64 % m);
    for (;;) {
      const r = new DataView(ks.take(8).buffer).getBigUint64(0, true);
      if (r < limit) {
        const c = Number(r % m);
        this.cohorts.set(memo, c);
        return c;
      }
    }
  }

  /** The memoized PRR of `value` for the key `secret`: ceil(k/8) packed bytes, a pure function of (secret, spec, value). */
  permanentBits(value: number, secret: Uint8Array): Uint8Array {
    const key = RapporSpec.asSecret(secret);
    const v = this.checkValue(value);
    const memo = `${hex(key)}:${v}`;
    const hit = this.prrCache.get(memo);
    if (hit) return hit.slice();
    const bits = this.derivePermanent(v, key);
    if (this.prrCache.size >= RapporSpec.PRR_CACHE) this.prrCache.delete(this.prrCache.keys().next().value as string);
    this.prrCache.set(memo, bits);
    return bits.slice();
  }

  private derivePermanent(v: number, key: Uint8Array): Uint8Array {
    const k = this.numBits;
    const nbytes = (k + 7) >>> 3;
    const bloom = new Uint8Array(nbytes);
    for (const j of this.bloomPositions(v, this.cohortOf(key))) bloom[j >>> 3] = (bloom[j >>> 3] as number) | (1 << (j & 7));
    const ctx = new Uint8Array(16);
    ctx.set(fromHex(this.memoDerivationId));
    new DataView(ctx.buffer).setBigInt64(8, BigInt(v), true);
    const ks = new Keystream(key, LABEL_PRR, ctx);
    const fake = ks.bernoulli(this.f, k);
    const coin = ks.bits(k);
    const out = new Uint8Array(nbytes);
    for (let i = 0; i < nbytes; i++) out[i] = ((fake[i] as number) & (coin[i] as number)) | (~(fake[i] as number) & (bloom[i] as number) & 0xff);
    return out;
  }

  /** One report of a device: its fixed cohort, the memoized PRR of `value`, a fresh IRR from `rng`. */
  encodeMemoized(value: number, secret: Uint8Array, rng: RandomSource, prr?: Uint8Array): Uint8Array {
    const cohort = this.cohortOf(secret);
    const perm = prr ?? this.permanentBits(value, secret);
    const w = this.nWords;
    const ones = this.bernoulli(this.q, w, rng);
    const zeros = this.bernoulli(this.p, w, rng);
    const a = packBits(ones, 8 * w * 8);
    const b = packBits(zeros, 8 * w * 8);
    const bits = new Uint8Array(perm.length);
    for (let i = 0; i < perm.length; i++) bits[i] = ((perm[i] as number) & (a[i] as number)) | (~(perm[i] as number) & (b[i] as number) & 0xff);
    if (this.numBits % 8) bits[bits.length - 1] = (bits[bits.length - 1] as number) & ((1 << (this.numBits % 8)) - 1);
    return packRecord(this.fields, [cohort, bits]);
  }

  countVariance(): number[] {
    throw new SpecError("rappor: the least-squares variance needs the decoding design; it is computed by the estimator (Python)");
  }
}
