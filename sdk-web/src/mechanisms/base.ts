/**
 * The common shape of every mechanism spec, as in ldp_core/mechanisms/base.py.
 *
 * A spec is a frozen, validated value: ε, the domain size and its own parameters, in the
 * Python dataclass's field order. Its `specId` is the first 16 hex digits of SHA-256 over the
 * RFC 8785 form of `toDict()`; `memoDerivationId` (Python's `memo_derivation_id`: `json.dumps`
 * with sorted keys) keys the device-side derivations of memoized state and never travels. A record is a fixed-width
 * little-endian struct ({@link RecordField}s); `encodeOne` privatizes one domain index into
 * one record's bytes, drawing from an explicit {@link RandomSource}.
 */
import { sha256 } from "@noble/hashes/sha2.js";
import { canonicalJson, memoDerivationJson, type JsonValue, type MemoDerivationField } from "../canonical.js";
import { DomainError, SpecError } from "../errors.js";
import { utf8 } from "../hashing.js";
import type { RandomSource } from "../random.js";

export const MAX_EPSILON = 30.0;

/** A record field: an unsigned little-endian integer of 1, 2 or 4 bytes, or packed bits (`bytes`). */
export interface RecordField {
  readonly name: string;
  readonly kind: "uint" | "bytes";
  readonly size: number;
  /** Exclusive upper bound of an integer field (checked on decode). */
  readonly bound?: number;
  /** For packed bits: how many bits are used (padding bits above must be 0). */
  readonly nbits?: number;
  /** A signed (two's complement) integer field: the JSON form writes it negative when it is. */
  readonly signed?: boolean;
  /** Inclusive lower bound of a signed field (checked on decode). */
  readonly min?: number;
}

/** A spec parameter: its value and whether Python holds it as a float (for the memo derivation id). */
export interface Param {
  readonly value: string | number;
  readonly float?: boolean;
}

/** The narrowest unsigned integer size (bytes) that holds `n - 1` (client_sdk grr_index_dtype). */
export function indexSize(n: number): 1 | 2 | 4 {
  if (n <= 1 << 8) return 1;
  if (n <= 1 << 16) return 2;
  return 4;
}

export function hex(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += b.toString(16).padStart(2, "0");
  return s;
}

export function fromHex(s: string): Uint8Array {
  if (typeof s !== "string" || s.length % 2 || /[^0-9a-fA-F]/.test(s)) throw new TypeError(`not a hex string: ${String(s)}`);
  const out = new Uint8Array(s.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(s.slice(2 * i, 2 * i + 2), 16);
  return out;
}

export function requireInt(spec: string, field: string, value: unknown, low: number, high: number): number {
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new SpecError(`${spec}: ${field} must be an integer, got ${JSON.stringify(value)}`);
  }
  if (!(low <= value && value <= high)) throw new SpecError(`${spec}: ${field} must be between ${low} and ${high}, got ${value}`);
  return value;
}

export function requireEpsilon(spec: string, eps: unknown): number {
  if (typeof eps !== "number") throw new SpecError(`${spec}: epsilon must be a number, got ${JSON.stringify(eps)}`);
  if (!Number.isFinite(eps) || eps <= 0) throw new SpecError(`${spec}: epsilon must be a finite number > 0, got ${eps}`);
  if (eps > MAX_EPSILON) throw new SpecError(`${spec}: epsilon ${eps} is above ${MAX_EPSILON}; such a report is not private`);
  return eps;
}

export function requireDomainSize(spec: string, d: unknown): number {
  if (typeof d !== "number" || !Number.isInteger(d)) throw new SpecError(`${spec}: domain_size must be an integer, got ${JSON.stringify(d)}`);
  if (d < 2) throw new SpecError(`${spec}: domain_size must be at least 2, got ${d}`);
  if (d > 2 ** 31) throw new SpecError(`${spec}: domain_size ${d} is above 2**31; use a hashed domain`);
  return d;
}

/** Pure-protocol variance [n_v p*(1-p*) + (n - n_v) q*(1-q*)] / (p* - q*)^2 (Wang et al. 2017, Sec. 3). */
export function pureProtocolVariance(trueCounts: readonly number[], pStar: number, qStar: number): number[] {
  const n = trueCounts.reduce((a, b) => a + b, 0);
  const d2 = (pStar - qStar) ** 2;
  return trueCounts.map((c) => (c * pStar * (1 - pStar) + (n - c) * qStar * (1 - qStar)) / d2);
}

/**
 * What every privatized report's spec has, whatever it estimates (Python's `ReportSpec`): ε, its
 * own parameters, the ids and the record layout. Frequency oracles ({@link MechanismSpec}) add a
 * domain size; numeric and heavy-hitter specs (numeric.ts, squarewave.ts, repeated.ts,
 * heavyhitters.ts) their ranges and lengths.
 */
export abstract class ReportSpec {
  abstract readonly name: string;
  readonly epsilon: number;
  private ids?: { specId: string; memoDerivationId: string; canonical: string };

  protected constructor(name: string, epsilon: unknown) {
    this.epsilon = requireEpsilon(name, epsilon);
  }

  /** What the reports estimate: "frequency", "mean", "distribution" or "heavy_hitters". */
  get kind(): string {
    return "frequency";
  }

  /** Whether a device reports through memoized responses keyed by its per-metric key (pinned definitions). */
  get memoized(): boolean {
    return false;
  }

  get expEpsilon(): number {
    return Math.exp(this.epsilon);
  }

  /** The parameters after ε (and domain_size), in the Python dataclass's field order. */
  protected abstract ownParams(): [string, Param][];

  /** Every parameter, in field order (epsilon, own fields). */
  params(): [string, Param][] {
    return [["epsilon", { value: this.epsilon, float: true }], ...this.ownParams()];
  }

  /** `{"mechanism": name, ...params}`: what metric files and the collector's catalog carry. */
  toDict(): Record<string, JsonValue> {
    const out: Record<string, JsonValue> = { mechanism: this.name };
    for (const [k, p] of this.params()) out[k] = p.value;
    return out;
  }

  private computeIds(): { specId: string; memoDerivationId: string; canonical: string } {
    if (!this.ids) {
      const canonical = canonicalJson(this.toDict());
      const memo: Record<string, MemoDerivationField> = { mechanism: { value: this.name } };
      for (const [k, p] of this.params()) memo[k] = { value: p.value, float: p.float ?? false };
      this.ids = {
        canonical,
        specId: hex(sha256(utf8(canonical))).slice(0, 16),
        memoDerivationId: hex(sha256(utf8(memoDerivationJson(memo)))).slice(0, 16),
      };
    }
    return this.ids;
  }

  /** The RFC 8785 canonical text of `toDict()`. */
  get canonical(): string {
    return this.computeIds().canonical;
  }

  /** 16 lowercase hex digits: the first 8 bytes of SHA-256 over the canonical form. */
  get specId(): string {
    return this.computeIds().specId;
  }

  /**
   * The key of this spec's memoized device state (memo key, RAPPOR's cohort and permanent bits):
   * 16 hex digits of SHA-256 over Python's `json.dumps(toDict(), sort_keys=True)`, as Python's
   * `memo_derivation_id`. Never sent and never accepted as a spec id; it must never change.
   */
  get memoDerivationId(): string {
    return this.computeIds().memoDerivationId;
  }

  abstract get recordFields(): readonly RecordField[];

  get recordSize(): number {
    return this.recordFields.reduce((a, f) => a + f.size, 0);
  }
}

export abstract class MechanismSpec extends ReportSpec {
  readonly domainSize: number;

  protected constructor(name: string, epsilon: unknown, domainSize: unknown) {
    super(name, epsilon);
    this.domainSize = requireDomainSize(name, domainSize);
  }

  /** Every parameter, in field order (epsilon, domain_size, own fields). */
  override params(): [string, Param][] {
    return [["epsilon", { value: this.epsilon, float: true }], ["domain_size", { value: this.domainSize }], ...this.ownParams()];
  }

  /** Raise {@link DomainError} unless `value` is a domain index. */
  checkValue(value: unknown): number {
    if (typeof value !== "number" || !Number.isInteger(value)) {
      throw new DomainError(`${this.name}: values must be integer domain indices, got ${String(value)}`);
    }
    if (value < 0 || value >= this.domainSize) throw new DomainError(`${this.name}: value ${value} is outside the domain [0, ${this.domainSize})`);
    return value;
  }

  /** Privatize one domain index into one record's bytes. */
  abstract encodeOne(value: number, rng: RandomSource): Uint8Array;

  /** Theoretical variance of each unbiased count estimate given the true counts. */
  abstract countVariance(trueCounts: readonly number[]): number[];
}

/** Write an unsigned integer of `size` bytes, little-endian. */
export function putUint(out: Uint8Array, offset: number, size: number, v: number): void {
  for (let i = 0; i < size; i++) out[offset + i] = Math.floor(v / 2 ** (8 * i)) & 0xff;
}

export function getUint(data: Uint8Array, offset: number, size: number): number {
  let v = 0;
  for (let i = size - 1; i >= 0; i--) v = v * 256 + (data[offset + i] as number);
  return v;
}

/** A record's bytes from its field values (integers, or packed bytes). */
export function packRecord(fields: readonly RecordField[], values: readonly (number | Uint8Array)[]): Uint8Array {
  const size = fields.reduce((a, f) => a + f.size, 0);
  const out = new Uint8Array(size);
  let off = 0;
  fields.forEach((f, i) => {
    const v = values[i];
    if (f.kind === "bytes") out.set(v as Uint8Array, off);
    else putUint(out, off, f.size, v as number);
    off += f.size;
  });
  return out;
}
