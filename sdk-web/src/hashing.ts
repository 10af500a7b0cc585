/**
 * XXH32, bit-exact with the Python side (ldp_core/hashing.py).
 *
 * `xxh32Bytes` hashes arbitrary bytes (js-xxhash, a pure-TypeScript XXH32); strings are always
 * hashed as explicit UTF-8 bytes (`TextEncoder`). `xxh32U32` is XXH32 of one 32-bit value's
 * 4-byte little-endian form, written out for the encoders' hot path with the same steps as
 * Python's vectorized `xxh32_u32` (Collet's XXH32 for a 4-byte input). `reduceRange` is the
 * multiply-shift map `(h * g) >> 32` (Lemire 2019), computed exactly in doubles.
 */
import { xxHash32 } from "js-xxhash";

export const PRIME32_1 = 0x9e3779b1;
export const PRIME32_2 = 0x85ebca77;
export const PRIME32_3 = 0xc2b2ae3d;
export const PRIME32_4 = 0x27d4eb2f;
export const PRIME32_5 = 0x165667b1;

const UTF8 = new TextEncoder();

/** UTF-8 bytes of `s` (what every string hash hashes). */
export function utf8(s: string): Uint8Array {
  return UTF8.encode(s);
}

/** XXH32 of `data` under `seed` (an unsigned 32-bit result). */
export function xxh32Bytes(data: Uint8Array, seed = 0): number {
  return xxHash32(data, seed >>> 0) >>> 0;
}

/** XXH32 of the 4-byte little-endian form of `value` (mod 2**32) under `seed`. */
export function xxh32U32(value: number, seed: number): number {
  let h = ((seed >>> 0) + ((PRIME32_5 + 4) >>> 0)) >>> 0;
  h = (h + Math.imul(value >>> 0, PRIME32_3)) >>> 0;
  h = Math.imul((h << 17) | (h >>> 15), PRIME32_4) >>> 0;
  h ^= h >>> 15;
  h = Math.imul(h, PRIME32_2) >>> 0;
  h ^= h >>> 13;
  h = Math.imul(h, PRIME32_3) >>> 0;
  h ^= h >>> 16;
  return h >>> 0;
}

/** `(h * g) >> 32` for a 32-bit `h` and `g` below 2**37, exactly. */
export function reduceRange(h: number, g: number): number {
  const hi = Math.floor(h / 65536);
  const lo = h % 65536;
  return Math.floor((hi * g + Math.floor((lo * g) / 65536)) / 65536);
}

/** `reduceRange(xxh32U32(value, seed), g)`: a seeded hash into `[0, g)`. */
export function hashToRange(value: number, seed: number, g: number): number {
  return reduceRange(xxh32U32(value, seed), g);
}
