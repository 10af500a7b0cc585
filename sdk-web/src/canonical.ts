/**
 * Canonical JSON forms of specs.
 *
 * `canonicalJson` is RFC 8785 (JCS): keys sorted by UTF-16 code units, no whitespace,
 * ECMAScript number form. For the values a spec holds (finite numbers, strings, flat objects)
 * that is `JSON.stringify` with sorted keys, which is how RFC 8785 defines it.
 *
 * `memoDerivationJson` is Python's
 * `json.dumps(d, sort_keys=True, separators=(",", ":"))`, whose floats are written by
 * Python's `repr` (`1.0`, `1e-05`, `1.5e+16`) and strings with ASCII escapes. The memoized
 * device state is keyed by its hash (ldp_core/mechanisms/base.py, `memo_derivation_id`),
 * so the web SDK must reproduce it byte for byte. Each field says whether it is a float:
 * JavaScript numbers do not remember.
 */
import { CanonicalizationError } from "./canonicalError.js";

export { CanonicalizationError };

export type JsonScalar = string | number | boolean | null;
export type JsonValue = JsonScalar | JsonValue[] | { [key: string]: JsonValue };

function sortKeys(v: JsonValue): JsonValue {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v !== null && typeof v === "object") {
    const out: { [key: string]: JsonValue } = {};
    for (const k of Object.keys(v).sort()) out[k] = sortKeys(v[k] as JsonValue);
    return out;
  }
  if (typeof v === "number" && !Number.isFinite(v)) throw new CanonicalizationError(`${v} has no JSON form`);
  if (typeof v === "number" && Number.isInteger(v) && Math.abs(v) > 2 ** 53) {
    throw new CanonicalizationError(`integer ${v} is not exactly representable as an IEEE double`);
  }
  if (typeof v === "string" && /[\ud800-\udfff]/u.test(v.replace(/[\ud800-\udbff][\udc00-\udfff]/g, ""))) {
    throw new CanonicalizationError(`string ${JSON.stringify(v)} holds a lone surrogate`);
  }
  return v;
}

/** The RFC 8785 canonical text of `value`. */
export function canonicalJson(value: JsonValue): string {
  return JSON.stringify(sortKeys(value));
}

/** Python's `repr(float(x))`: the shortest round-trip digits, exponent form below 1e-4 and from 1e16. */
export function pythonFloatRepr(x: number): string {
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x > 0 ? "Infinity" : "-Infinity";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  if (x < 0) return "-" + pythonFloatRepr(-x);
  const [mant, expText] = x.toExponential().split("e") as [string, string];
  const digits = mant.replace(".", "");
  const e = Number(expText); // x = d.ddd * 10^e
  if (e < -4 || e >= 16) {
    const head = digits.length === 1 ? digits : `${digits[0]}.${digits.slice(1)}`;
    const sign = e < 0 ? "-" : "+";
    return `${head}e${sign}${String(Math.abs(e)).padStart(2, "0")}`;
  }
  if (e < 0) return "0." + "0".repeat(-e - 1) + digits;
  if (digits.length <= e + 1) return digits + "0".repeat(e + 1 - digits.length) + ".0";
  return digits.slice(0, e + 1) + "." + digits.slice(e + 1);
}

function pythonString(s: string): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const ch = s[i] as string;
    if (ch === '"') out += '\\"';
    else if (ch === "\\") out += "\\\\";
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (ch === "\b") out += "\\b";
    else if (ch === "\f") out += "\\f";
    else if (c < 0x20 || c > 0x7e) out += "\\u" + c.toString(16).padStart(4, "0");
    else out += ch;
  }
  return out + '"';
}

/** A spec field for `memoDerivationJson`: its value and, for numbers, whether Python holds it as a float. */
export type MemoDerivationField = { value: string | number | null; float?: boolean };

/** Python's `json.dumps(fields, sort_keys=True, separators=(",", ":"))` of a flat object. */
export function memoDerivationJson(fields: Record<string, MemoDerivationField>): string {
  const parts: string[] = [];
  for (const k of Object.keys(fields).sort()) {
    const f = fields[k] as MemoDerivationField;
    let v: string;
    if (f.value === null) v = "null";
    else if (typeof f.value === "string") v = pythonString(f.value);
    else if (f.float) v = pythonFloatRepr(f.value);
    else v = String(f.value);
    parts.push(`${pythonString(k)}:${v}`);
  }
  return "{" + parts.join(",") + "}";
}
