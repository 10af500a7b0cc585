/**
 * The values of numeric and heavy-hitter metrics, as ldp_core/domain.py's `NumberRange` and
 * `StringDomain`: what `record()` hands to the encoder is a number (or `dims` numbers), clamped into
 * the range or refused (`out_of_range`), or a string's padded bytes.
 */
import { DomainError, SpecError } from "./errors.js";
import { padValue, requireEndMarker, type Overflow } from "./mechanisms/heavyhitters.js";

/** What a metric's domain hands the encoder: a domain index, a number, numbers, or padded bytes. */
export type DomainInput = number | readonly number[] | Uint8Array;

export class NumberRange {
  readonly kind = "range";
  constructor(
    readonly low: number,
    readonly high: number,
    readonly outOfRange: "clamp" | "refuse" = "clamp",
    readonly dims = 1,
  ) {
    for (const [f, v] of [
      ["low", low],
      ["high", high],
    ] as const) {
      if (typeof v !== "number" || !Number.isFinite(v)) throw new SpecError(`range domain: '${f}' must be a finite number, got ${JSON.stringify(v)}`);
    }
    if (!(low < high)) throw new SpecError(`range domain: low (${low}) must be below high (${high})`);
    if (outOfRange !== "clamp" && outOfRange !== "refuse") throw new SpecError(`range domain: 'out_of_range' must be 'clamp' or 'refuse', got ${JSON.stringify(outOfRange)}`);
  }
  /** Not a number of indices: numeric metrics have none. */
  get size(): number {
    return 0;
  }
  private one(value: unknown): [number, boolean] {
    if (typeof value !== "number") throw new DomainError(`a numeric metric takes a number, got ${value === null ? "null" : typeof value}`);
    if (!Number.isFinite(value)) throw new DomainError(`a numeric metric takes a finite number, got ${value}`);
    if (value < this.low || value > this.high) {
      if (this.outOfRange === "refuse") throw new DomainError(`value ${value} is outside [${this.low}, ${this.high}]`);
      return [Math.min(Math.max(value, this.low), this.high), true];
    }
    return [value, false];
  }
  /** [what to privatize, whether a number was clamped]; DomainError for a value refused. */
  prepare(value: unknown): [number | number[], boolean] {
    if (this.dims === 1) return this.one(value);
    if (!Array.isArray(value)) throw new DomainError(`this numeric metric has ${this.dims} attributes: record an array of ${this.dims} numbers`);
    if (value.length !== this.dims) throw new DomainError(`this numeric metric has ${this.dims} attributes, got ${value.length} numbers`);
    const parts = value.map((v) => this.one(v));
    return [parts.map((p) => p[0]), parts.some((p) => p[1])];
  }
  indexOf(value: unknown): number | number[] {
    return this.prepare(value)[0];
  }
  withDims(dims: number): NumberRange {
    return new NumberRange(this.low, this.high, this.outOfRange, dims);
  }
  toDict(): { kind: "range"; low: number; high: number; out_of_range: string } {
    return { kind: "range", low: this.low, high: this.high, out_of_range: this.outOfRange };
  }
}

export class StringDomain {
  readonly kind = "string";
  readonly endMarker: 0 | 1;
  constructor(
    readonly length: number,
    readonly overflow: Overflow = "truncate",
    endMarker: unknown = 0,
  ) {
    if (!Number.isInteger(length) || length < 1 || length > 64) throw new SpecError(`string domain: 'length' must be an integer from 1 to 64 bytes, got ${JSON.stringify(length)}`);
    if (overflow !== "truncate" && overflow !== "refuse") throw new SpecError(`string domain: 'overflow' must be 'truncate' or 'refuse', got ${JSON.stringify(overflow)}`);
    this.endMarker = requireEndMarker("string domain", endMarker);
  }
  get size(): number {
    return 0;
  }
  /** The padded bytes to privatize, or DomainError. */
  indexOf(value: unknown): Uint8Array {
    return padValue(value, this.length, this.overflow, this.endMarker);
  }
  toDict(): Record<string, string | number> {
    const out: Record<string, string | number> = { kind: "string", length: this.length, overflow: this.overflow };
    if (this.endMarker === 1) out.end_marker = 1;
    return out;
  }
}

export function rangeFromDict(d: Record<string, unknown>): NumberRange {
  const unknown = Object.keys(d).filter((k) => !["kind", "low", "high", "out_of_range"].includes(k));
  if (unknown.length) throw new SpecError(`range domain: unknown key(s) ${unknown.sort().join(", ")}`);
  return new NumberRange(d.low as number, d.high as number, (d.out_of_range ?? "clamp") as "clamp");
}

export function stringFromDict(d: Record<string, unknown>): StringDomain {
  const unknown = Object.keys(d).filter((k) => !["kind", "length", "overflow", "end_marker"].includes(k));
  if (unknown.length) throw new SpecError(`string domain: unknown key(s) ${unknown.sort().join(", ")}`);
  return new StringDomain(d.length as number, (d.overflow ?? "truncate") as Overflow, d.end_marker ?? 0);
}
