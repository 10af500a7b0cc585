/**
 * Repeated counters, device side, as ldp_core/mechanisms/repeated.py (Ding, Kulkarni and Yekhanin,
 * "Collecting Telemetry Data Privately", NeurIPS 2017): 1BitMean with α-point rounding and
 * dBitFlip, both memoized.
 *
 * A device's memoized state is *derived*, never stored: an HMAC-SHA256 keystream (RAPPOR's, see
 * rappor.ts) under the per-metric key (keyed BLAKE2b of the device secret, which lives in the
 * client's IndexedDB store), labelled per use and keyed by the spec's memo derivation id. So a
 * device that keeps reporting the same rounded value (1BitMean) or bucket (dBitFlip) sends the same
 * bytes every day, in every tab and after every reload, and nothing about its values is written.
 *
 * `encodeOne` is the simulation encoder (a fresh device per report); it has the distribution of
 * Python's batch encoder, and for 1BitMean its draws too (α, then the bit). dBitFlip's fresh d
 * buckets are a partial Fisher–Yates shuffle here (Python's argpartition order is not reproducible):
 * the same distribution, not the same draws.
 */
import { SpecError } from "../errors.js";
import type { RandomSource } from "../random.js";
import { fromHex, requireInt, type Param, type RecordField } from "./base.js";
import { NumericSpec } from "./numeric.js";
import { Keystream, u64le } from "./rappor.js";

export const MAX_GRANULARITY = 1 << 16;
export const MAX_BUCKETS = 1 << 16;
export const MAX_SAMPLE = 256;
const enc = new TextEncoder();
const LABEL_ALPHA = enc.encode("ldp-telemetry/1bitmean/alpha/v1");
const LABEL_BIT = enc.encode("ldp-telemetry/1bitmean/bit/v1");
const LABEL_SAMPLE = enc.encode("ldp-telemetry/dbitflip/sample/v1");
const LABEL_BITS = enc.encode("ldp-telemetry/dbitflip/bits/v1");
const TWO64 = 1n << 64n;

function u64(bytes: Uint8Array): bigint {
  let v = 0n;
  for (let i = 7; i >= 0; i--) v = (v << 8n) | BigInt(bytes[i] as number);
  return v;
}

/** A uniform float in [0, 1) with 53 bits of the keystream (Python's `keystream_uniform`). */
export function keystreamUniform(ks: Keystream): number {
  return Number(u64(ks.take(8)) >> 11n) / 2 ** 53;
}

/** A uniform integer in [0, m) from 64-bit keystream words by rejection (Python's `keystream_index`). */
export function keystreamIndex(ks: Keystream, m: number): number {
  const mm = BigInt(m);
  const limit = TWO64 - (TWO64 % mm);
  for (;;) {
    const r = u64(ks.take(8));
    if (r < limit) return Number(r % mm);
  }
}

function withValue(memoId: string, v: number): Uint8Array {
  const id = fromHex(memoId);
  const out = new Uint8Array(id.length + 8);
  out.set(id, 0);
  out.set(u64le(v), id.length);
  return out;
}

/** Memoized responses already derived, per device key (object identity) and value: each is a pure function
 * of (key, spec, value), so caching changes no byte; it spares the HMACs on the hot path. At most
 * {@link MEMO_CACHE} entries per key (the policy's bounds keep real specs well below). */
export const MEMO_CACHE = 1024;
export class MemoCache<T> {
  private readonly byKey = new WeakMap<Uint8Array, Map<number, T>>();
  get(key: Uint8Array, v: number, derive: () => T): T {
    let m = this.byKey.get(key);
    if (!m) this.byKey.set(key, (m = new Map()));
    let out = m.get(v);
    if (out === undefined) {
      out = derive();
      if (m.size >= MEMO_CACHE) m.clear();
      m.set(v, out);
    }
    return out;
  }
}

function requireKey(secret: Uint8Array): Uint8Array {
  if (!(secret instanceof Uint8Array) || secret.length < 16) throw new SpecError("a memoized encoder needs a device key of at least 16 bytes");
  return secret;
}

/** 1BitMean with α-point rounding to granularity + 1 grid points (kind "mean"). */
export class OneBitMeanSpec extends NumericSpec {
  readonly name = "1bitmean";
  readonly granularity: number;
  private readonly fields: RecordField[] = [{ name: "bit", kind: "uint", size: 1, bound: 2 }];
  private readonly memo = new MemoCache<number>();

  constructor(params: { epsilon: number; low: number; high: number; granularity?: number }) {
    super("1bitmean", params);
    this.granularity = requireInt("1bitmean", "granularity", params.granularity ?? 16, 1, MAX_GRANULARITY);
  }
  override get memoized(): boolean {
    return true;
  }
  protected ownParams(): [string, Param][] {
    return [...this.rangeParams(), ["granularity", { value: this.granularity }]];
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  get dims(): number {
    return 1;
  }
  /** p(t) = 1/(e + 1) + t (e − 1)/(e + 1). */
  bitProbability(t: number): number {
    const e = this.expEpsilon;
    return 1.0 / (e + 1.0) + (t * (e - 1.0)) / (e + 1.0);
  }
  summandVariance(t: number): number {
    const e = this.expEpsilon;
    return ((1.0 + t * (e - 1.0)) * (e - t * (e - 1.0))) / (e - 1.0) ** 2;
  }
  unit(value: number): number {
    return (this.normalize(value) + 1.0) / 2.0;
  }
  roundToGrid(t: number, alpha: number): number {
    const s = this.granularity;
    const u = t * s;
    const low = Math.floor(u);
    const j = low + (u - low > alpha ? 1 : 0);
    return Math.min(s, Math.max(0, j));
  }
  deviceAlpha(key: Uint8Array): number {
    return keystreamUniform(new Keystream(requireKey(key), LABEL_ALPHA, fromHex(this.memoDerivationId)));
  }
  gridBit(j: number, key: Uint8Array): number {
    const ks = new Keystream(requireKey(key), LABEL_BIT, withValue(this.memoDerivationId, j));
    return (ks.bernoulli(this.bitProbability(j / this.granularity), 1)[0] as number) & 1;
  }
  /** A fresh simulated device: α, then the bit of its grid point (Python's batch draws). */
  encodeNumber(value: number | readonly number[], rng: RandomSource): Uint8Array {
    const t = this.unit(value as number);
    const j = this.roundToGrid(t, rng.float53());
    return Uint8Array.of(rng.float53() < this.bitProbability(j / this.granularity) ? 1 : 0);
  }
  /** This device's report: its fixed α and the memoized bit of the value's grid point (no draws). */
  encodeMemoized(value: number | readonly number[], key: Uint8Array, _rng?: RandomSource): Uint8Array {
    const t = this.unit(value as number);
    const j = this.roundToGrid(t, this.memo.get(key, -1, () => this.deviceAlpha(key)));
    return Uint8Array.of(this.memo.get(key, j, () => this.gridBit(j, key)));
  }
}

/** dBitFlip over `buckets` equal buckets, `sample` of them per device (kind "distribution"). */
export class DBitFlipSpec extends NumericSpec {
  readonly name = "dbitflip";
  readonly buckets: number;
  readonly sample: number;
  private readonly fields: RecordField[];
  private sampledCache: { key: Uint8Array; buckets: number[] } | null = null;
  private readonly memo = new MemoCache<Uint8Array>();

  constructor(params: { epsilon: number; low: number; high: number; buckets?: number; sample?: number | null }) {
    super("dbitflip", params);
    this.buckets = requireInt("dbitflip", "buckets", params.buckets ?? 32, 2, MAX_BUCKETS);
    this.sample = requireInt("dbitflip", "sample", params.sample ?? Math.min(this.buckets, 4), 1, Math.min(this.buckets, MAX_SAMPLE));
    const idx = this.buckets <= 256 ? 1 : 2;
    this.fields = [
      { name: "bucket", kind: "bytes", size: idx * this.sample },
      { name: "bits", kind: "bytes", size: (this.sample + 7) >>> 3, nbits: this.sample },
    ];
  }
  override get kind(): string {
    return "distribution";
  }
  override get memoized(): boolean {
    return true;
  }
  protected ownParams(): [string, Param][] {
    return [...this.rangeParams(), ["buckets", { value: this.buckets }], ["sample", { value: this.sample }]];
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  get k(): number {
    return this.buckets;
  }
  get d(): number {
    return this.sample;
  }
  get eHalf(): number {
    return Math.exp(this.epsilon / 2.0);
  }
  get p(): number {
    return this.eHalf / (this.eHalf + 1.0);
  }
  get q(): number {
    return 1.0 / (this.eHalf + 1.0);
  }
  /** Exact Var of each bucket's estimated share given the true counts (Python's `share_variance`). */
  shareVariance(trueCounts: readonly number[], n?: number): number[] {
    const total = n ?? trueCounts.reduce((a, b) => a + b, 0);
    const e = this.eHalf;
    const r = this.k / this.d;
    const hold = (r * (e * e - e + 1.0)) / (e - 1.0) ** 2 - 1.0;
    const other = (r * e) / (e - 1.0) ** 2;
    return trueCounts.map((c) => (c * hold + (total - c) * other) / (total * total));
  }
  bucketOf(value: number): number {
    const t = (this.normalize(value) + 1.0) / 2.0;
    return Math.min(Math.floor(t * this.k), this.k - 1);
  }
  /** The device's d sampled buckets: a partial Fisher–Yates shuffle driven by its keystream. */
  deviceBuckets(key: Uint8Array): number[] {
    if (this.sampledCache && this.sampledCache.key === key) return this.sampledCache.buckets;
    const ks = new Keystream(requireKey(key), LABEL_SAMPLE, fromHex(this.memoDerivationId));
    const pool = new Map<number, number>();
    const out: number[] = [];
    for (let i = 0; i < this.d; i++) {
      const j = i + keystreamIndex(ks, this.k - i);
      out.push(pool.get(j) ?? j);
      pool.set(j, pool.get(i) ?? i);
    }
    this.sampledCache = { key, buckets: out };
    return out;
  }
  /** The d memoized bits for `bucket`: d Bernoulli(q) bits, then one Bernoulli(p) for the sampled position equal to it. */
  memoizedBits(bucket: number, sampled: readonly number[], key: Uint8Array): number[] {
    const ks = new Keystream(requireKey(key), LABEL_BITS, withValue(this.memoDerivationId, bucket));
    const word = ks.bernoulli(this.q, this.d);
    const hold = (ks.bernoulli(this.p, 1)[0] as number) & 1;
    const bits = Array.from({ length: this.d }, (_, i) => ((word[i >>> 3] as number) >>> (i & 7)) & 1);
    const at = sampled.indexOf(bucket);
    if (at >= 0) bits[at] = hold;
    return bits;
  }
  private record(buckets: readonly number[], bits: readonly number[]): Uint8Array {
    const idx = this.k <= 256 ? 1 : 2;
    const out = new Uint8Array(this.recordSize);
    buckets.forEach((b, i) => {
      out[idx * i] = b & 0xff;
      if (idx === 2) out[idx * i + 1] = b >>> 8;
    });
    const off = idx * this.d;
    bits.forEach((b, i) => {
      if (b) out[off + (i >>> 3)] = (out[off + (i >>> 3)] as number) | (1 << (i & 7));
    });
    return out;
  }
  /** A fresh simulated device: d distinct uniform buckets (partial Fisher–Yates), fresh bits. */
  encodeNumber(value: number | readonly number[], rng: RandomSource): Uint8Array {
    const v = this.bucketOf(value as number);
    const pool = new Map<number, number>();
    const buckets: number[] = [];
    for (let i = 0; i < this.d; i++) {
      const j = i + rng.below(this.k - i);
      buckets.push(pool.get(j) ?? j);
      pool.set(j, pool.get(i) ?? i);
    }
    const bits = buckets.map((b) => (rng.float53() < (b === v ? this.p : this.q) ? 1 : 0));
    return this.record(buckets, bits);
  }
  /** This device's report: its fixed buckets and the memoized bits of the value's bucket (no draws). */
  encodeMemoized(value: number | readonly number[], key: Uint8Array, _rng?: RandomSource): Uint8Array {
    const v = this.bucketOf(value as number);
    return this.memo
      .get(key, v, () => {
        const sampled = this.deviceBuckets(key);
        return this.record(sampled, this.memoizedBits(v, sampled, key));
      })
      .slice();
  }
}
