/**
 * Many independent Bernoulli(q) bits, 64 to a word: the bit-sliced comparison of uniforms with
 * q's binary digits of ldp_core/bernoulli.py, drawing the same words in the same order.
 *
 * The t-th random word supplies the t-th binary digit of 64 independent uniforms U; a lane is
 * decided at the first digit where U and q differ (U < q when that digit of U is 0 and of q is 1).
 * Every digit of the double q is used, so each bit is 1 with probability exactly q. Words are
 * `Uint32Array` pairs (low half, high half). The first {@link FULL_STEPS} digits draw a word for
 * every word of a chunk of {@link CHUNK} words; after that only the words with undecided lanes
 * draw, in index order, and a word leaves as soon as all its lanes are decided.
 */
import type { RandomSource } from "./random.js";

export const CHUNK = 1 << 14;
export const FULL_STEPS = 10;

/** The binary digits b1 b2 ... of q = 0.b1 b2 ... (q in [0, 1), exact; the last digit is 1). */
export function probabilityDigits(q: number): number[] {
  if (!(q >= 0 && q < 1)) throw new RangeError(`probability must be in [0, 1), got ${q}`);
  const out: number[] = [];
  let x = q;
  while (x !== 0) {
    x *= 2;
    const d = x >= 1 ? 1 : 0;
    out.push(d);
    x -= d;
  }
  return out;
}

/** `nWords` 64-bit words (as 2·nWords uint32 halves) whose bits are independent Bernoulli(q). */
export function bernoulliWords(q: number, nWords: number, rng: RandomSource, digits: readonly number[] = probabilityDigits(q)): Uint32Array {
  const out = new Uint32Array(2 * nWords);
  if (nWords === 0 || digits.length === 0) return out;
  const undecided = new Uint32Array(2 * nWords);
  const u = new Uint32Array(2 * Math.min(CHUNK, nWords));
  const first = Math.min(FULL_STEPS, digits.length);
  for (let start = 0; start < nWords; start += CHUNK) {
    const stop = Math.min(nWords, start + CHUNK);
    const m = stop - start;
    undecided.fill(0xffffffff, 2 * start, 2 * stop);
    for (let t = 0; t < first; t++) {
      rng.words64(u, 0, m);
      if (digits[t]) {
        for (let i = 0; i < 2 * m; i++) {
          const j = 2 * start + i;
          const und = undecided[j] as number;
          const w = u[i] as number;
          out[j] = ((out[j] as number) | (und & ~w)) >>> 0;
          undecided[j] = (und & w) >>> 0;
        }
      } else {
        for (let i = 0; i < 2 * m; i++) {
          const j = 2 * start + i;
          undecided[j] = ((undecided[j] as number) & ~(u[i] as number)) >>> 0;
        }
      }
    }
  }
  if (first === digits.length) return out;
  let idx: number[] = [];
  for (let w = 0; w < nWords; w++) if (undecided[2 * w] !== 0 || undecided[2 * w + 1] !== 0) idx.push(w);
  if (idx.length === 0) return out;
  let buf = new Uint32Array(2 * idx.length);
  for (let t = first; t < digits.length; t++) {
    if (buf.length < 2 * idx.length) buf = new Uint32Array(2 * idx.length);
    rng.words64(buf, 0, idx.length);
    const keep: number[] = [];
    for (let k = 0; k < idx.length; k++) {
      const w = idx[k] as number;
      for (let h = 0; h < 2; h++) {
        const j = 2 * w + h;
        const und = undecided[j] as number;
        const r = buf[2 * k + h] as number;
        if (digits[t]) {
          out[j] = ((out[j] as number) | (und & ~r)) >>> 0;
          undecided[j] = (und & r) >>> 0;
        } else {
          undecided[j] = (und & ~r) >>> 0;
        }
      }
      if (undecided[2 * w] !== 0 || undecided[2 * w + 1] !== 0) keep.push(w);
    }
    idx = keep;
    if (idx.length === 0) break;
  }
  return out;
}

/** Bit `i` of a word array (uint32 halves). */
export function getBit(words: Uint32Array, i: number): number {
  return ((words[i >>> 5] as number) >>> (i & 31)) & 1;
}

/** Set bit `i` of a word array to `b` (0 or 1). */
export function setBit(words: Uint32Array, i: number, b: number): void {
  const j = i >>> 5;
  const mask = 1 << (i & 31);
  words[j] = (b ? (words[j] as number) | mask : (words[j] as number) & ~mask) >>> 0;
}

/** The first `nbits` bits of `words` as ceil(nbits/8) little-endian packed bytes, padding bits cleared. */
export function packBits(words: Uint32Array, nbits: number, wordOffset = 0): Uint8Array {
  const nbytes = (nbits + 7) >>> 3;
  const out = new Uint8Array(nbytes);
  for (let i = 0; i < nbytes; i++) out[i] = ((words[wordOffset + (i >>> 2)] as number) >>> ((i & 3) * 8)) & 0xff;
  if (nbits % 8) out[nbytes - 1] = (out[nbytes - 1] as number) & ((1 << (nbits % 8)) - 1);
  return out;
}
