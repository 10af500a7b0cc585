/**
 * Mapping application values to domain indices, as ldp_core/domain.py: a `Dictionary`
 * (declared values, optionally an "other" bucket) or a `HashedDomain` (XXH32 of a type-tagged
 * byte form, modulo the size). Strings are `"s" ‖ UTF-8`, integers `"i" ‖ int64 LE`, so
 * `"1"` and `1` differ. Integers beyond 2**53 are given as `bigint`.
 */
import { DomainError, SpecError } from "./errors.js";
import { utf8, xxh32Bytes } from "./hashing.js";
import { NumberRange, StringDomain, rangeFromDict, stringFromDict } from "./valuedomains.js";

export type Value = string | number | bigint;

function isIntValue(v: unknown): v is number | bigint {
  return typeof v === "bigint" || (typeof v === "number" && Number.isInteger(v));
}

/** The type-tagged byte form hashed domains hash. */
export function canonicalBytes(value: Value): Uint8Array {
  if (typeof value === "string") {
    const b = utf8(value);
    const out = new Uint8Array(1 + b.length);
    out[0] = 0x73;
    out.set(b, 1);
    return out;
  }
  if (!isIntValue(value)) throw new DomainError(`values must be strings or integers, got ${typeof value === "number" ? value : typeof value}`);
  const big = BigInt(value);
  if (big < -(1n << 63n) || big >= 1n << 63n) throw new DomainError(`integer value ${big} does not fit in 64 bits`);
  const out = new Uint8Array(9);
  out[0] = 0x69;
  new DataView(out.buffer).setBigInt64(1, big, true);
  return out;
}

function key(v: Value): string {
  return typeof v === "string" ? `s:${v}` : `i:${BigInt(v)}`;
}

export class Dictionary {
  readonly kind = "dictionary";
  readonly values: readonly (string | number)[];
  readonly other: boolean;
  private readonly index = new Map<string, number>();

  constructor(values: readonly (string | number)[], other = false) {
    values.forEach((v, i) => {
      canonicalBytes(v);
      if (this.index.has(key(v))) throw new SpecError("dictionary values must be distinct");
      this.index.set(key(v), i);
    });
    if (values.length + (other ? 1 : 0) < 2) throw new SpecError("a dictionary needs at least 2 entries (counting the 'other' bucket)");
    this.values = [...values];
    this.other = other;
  }
  get size(): number {
    return this.values.length + (this.other ? 1 : 0);
  }
  indexOf(value: Value): number {
    canonicalBytes(value);
    const i = this.index.get(key(value));
    if (i !== undefined) return i;
    if (this.other) return this.values.length;
    throw new DomainError(`value ${JSON.stringify(String(value))} is not in the metric's dictionary and it has no 'other' bucket`);
  }
  toDict(): { kind: "dictionary"; values: (string | number)[]; other: boolean } {
    return { kind: "dictionary", values: [...this.values], other: this.other };
  }
}

export class HashedDomain {
  readonly kind = "hashed";
  constructor(
    readonly size: number,
    readonly seed = 0,
  ) {
    if (!Number.isInteger(size) || size < 2 || size > 2 ** 31) throw new SpecError(`hashed domain size must be an integer in [2, 2**31], got ${size}`);
    if (!Number.isInteger(seed) || seed < 0 || seed >= 2 ** 32) throw new SpecError(`hashed domain seed must be a 32-bit unsigned integer, got ${seed}`);
  }
  indexOf(value: Value): number {
    return xxh32Bytes(canonicalBytes(value), this.seed) % this.size;
  }
  toDict(): { kind: "hashed"; size: number; seed: number } {
    return { kind: "hashed", size: this.size, seed: this.seed };
  }
}

export type Domain = Dictionary | HashedDomain | NumberRange | StringDomain;

export function domainFromDict(data: unknown): Domain {
  const d = (data ?? {}) as Record<string, unknown>;
  if (d.kind === "dictionary") {
    if (!Array.isArray(d.values)) throw new SpecError("dictionary domain: 'values' must be a list");
    return new Dictionary(d.values as (string | number)[], Boolean(d.other ?? false));
  }
  if (d.kind === "hashed") return new HashedDomain(Number(d.size), Number(d.seed ?? 0));
  if (d.kind === "range") return rangeFromDict(d);
  if (d.kind === "string") return stringFromDict(d);
  throw new SpecError(`domain kind must be 'dictionary', 'hashed', 'range' or 'string', got ${JSON.stringify(d.kind)}`);
}
