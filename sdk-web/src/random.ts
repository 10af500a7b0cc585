/**
 * Randomness for the encoders: what a mechanism draws, not how a generator makes it.
 *
 * Every encoder consumes a {@link RandomSource}: uniform floats of 53 random bits, uniform
 * integers below a bound, and whole 64-bit words (the Bernoulli bit-slicer's input). The same
 * three kinds are what the shared test vectors record from the Python encoders
 * (tests/web/make_vectors.py), so {@link ReplaySource} can serve a Python encoder's draws to the
 * TypeScript one and the bytes must agree.
 *
 * On a device the source is {@link CryptoSource}: `crypto.getRandomValues` (the platform CSPRNG),
 * read at most 65,536 bytes per call as the Web Crypto API allows, never `Math.random`. A seeded
 * generator ({@link SimulationSource}) exists only for simulations and tests, as in Python
 * (`simulation_generator`); the client accepts one only in its explicit simulation mode.
 */

export interface RandomSource {
  /** A uniform float in [0, 1): k / 2**53 for a uniform 53-bit k. */
  float53(): number;
  /** A uniform integer in [0, n), 1 <= n <= 2**32. */
  below(n: number): number;
  /** Fill `out[2i]`, `out[2i + 1]` (low, high halves) with `count` uniform 64-bit words from `offset` (in words). */
  words64(out: Uint32Array, offset: number, count: number): void;
}

const TWO32 = 4294967296;
const TWO_M53 = 1 / 9007199254740992;

/** Uniform integers below n from uniform 32-bit words, by rejection (exactly uniform). */
function boundedFromU32(next: () => number, n: number): number {
  if (!(Number.isInteger(n) && n >= 1 && n <= TWO32)) throw new RangeError(`bound must be an integer in [1, 2**32], got ${n}`);
  if (n === TWO32) return next();
  const limit = TWO32 - (TWO32 % n);
  for (;;) {
    const r = next();
    if (r < limit) return r % n;
  }
}

/** The platform CSPRNG, buffered: `crypto.getRandomValues` on 16,384 words (64 KiB) at a time. */
export class CryptoSource implements RandomSource {
  static readonly CHUNK_WORDS = 16384; // 65,536 bytes, the Web Crypto limit per call
  private readonly buf = new Uint32Array(CryptoSource.CHUNK_WORDS);
  private pos = CryptoSource.CHUNK_WORDS;
  private readonly crypto: Crypto;

  constructor(cryptoImpl: Crypto | undefined = globalThis.crypto) {
    if (!cryptoImpl || typeof cryptoImpl.getRandomValues !== "function") {
      throw new Error("crypto.getRandomValues is not available: the SDK needs the Web Crypto API for its randomness");
    }
    this.crypto = cryptoImpl;
  }

  /** A uniform 32-bit word. */
  u32(): number {
    if (this.pos >= this.buf.length) {
      this.crypto.getRandomValues(this.buf);
      this.pos = 0;
    }
    return this.buf[this.pos++] as number;
  }

  float53(): number {
    const a = this.u32() >>> 5; // 27 bits
    const b = this.u32() >>> 6; // 26 bits
    return (a * 67108864 + b) * TWO_M53;
  }

  below(n: number): number {
    return boundedFromU32(() => this.u32(), n);
  }

  words64(out: Uint32Array, offset: number, count: number): void {
    for (let i = 2 * offset, end = 2 * (offset + count); i < end; i++) out[i] = this.u32();
  }

  /** `n` random bytes (device secrets, batch ids). */
  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i += 65536) this.crypto.getRandomValues(out.subarray(i, Math.min(n, i + 65536)));
    return out;
  }
}

/**
 * A seeded, reproducible and *not* secure generator: xoshiro128** (Blackman and Vigna, 2018),
 * seeded through SplitMix32. For simulations and tests only.
 */
export class SimulationSource implements RandomSource {
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;

  constructor(seed: number) {
    if (!Number.isInteger(seed) || seed < 0 || seed >= TWO32) throw new RangeError(`seed must be a 32-bit unsigned integer, got ${seed}`);
    let x = seed >>> 0;
    const splitmix = (): number => {
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.s0 = splitmix();
    this.s1 = splitmix();
    this.s2 = splitmix();
    this.s3 = splitmix();
  }

  u32(): number {
    const result = Math.imul(rotl(Math.imul(this.s1, 5) >>> 0, 7), 9) >>> 0;
    const t = (this.s1 << 9) >>> 0;
    this.s2 ^= this.s0;
    this.s3 ^= this.s1;
    this.s1 ^= this.s2;
    this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = rotl(this.s3 >>> 0, 11);
    this.s0 >>>= 0;
    this.s1 >>>= 0;
    this.s2 >>>= 0;
    return result;
  }

  float53(): number {
    const a = this.u32() >>> 5;
    const b = this.u32() >>> 6;
    return (a * 67108864 + b) * TWO_M53;
  }

  below(n: number): number {
    return boundedFromU32(() => this.u32(), n);
  }

  words64(out: Uint32Array, offset: number, count: number): void {
    for (let i = 2 * offset, end = 2 * (offset + count); i < end; i++) out[i] = this.u32();
  }

  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = this.u32() & 0xff;
    return out;
  }
}

function rotl(x: number, r: number): number {
  return ((x << r) | (x >>> (32 - r))) >>> 0;
}

/** A draw the replay source was asked for that the recording does not hold at that point. */
export class ReplayMismatchError extends Error {}

/**
 * Serves a recorded draw stream back in order (the shared vectors' tokens: `"f K"`, `"u N V"`,
 * `"w HEX"`; see tests/web/make_vectors.py). Asking for another kind or bound than the
 * recording holds next throws {@link ReplayMismatchError}: the order of consumption is pinned too.
 */
export class ReplaySource implements RandomSource {
  private pos = 0;
  constructor(private readonly tokens: readonly string[]) {}

  private next(kind: string): string[] {
    const tok = this.tokens[this.pos];
    if (tok === undefined) throw new ReplayMismatchError(`draw ${this.pos}: the recording has no more draws (wanted ${kind})`);
    const parts = tok.split(" ");
    if (parts[0] !== kind) throw new ReplayMismatchError(`draw ${this.pos}: wanted ${kind}, the recording holds "${tok}"`);
    this.pos++;
    return parts;
  }

  float53(): number {
    return Number(this.next("f")[1]) * TWO_M53;
  }

  below(n: number): number {
    const [, bound, value] = this.next("u");
    if (Number(bound) !== n) throw new ReplayMismatchError(`draw ${this.pos - 1}: wanted an integer below ${n}, the recording drew below ${bound}`);
    return Number(value);
  }

  words64(out: Uint32Array, offset: number, count: number): void {
    for (let i = 0; i < count; i++) {
      const hex = this.next("w")[1] as string;
      out[2 * (offset + i)] = parseInt(hex.slice(8), 16) >>> 0;
      out[2 * (offset + i) + 1] = parseInt(hex.slice(0, 8), 16) >>> 0;
    }
  }

  /** Draws not consumed yet (0 once an encoder used exactly what Python drew). */
  get remaining(): number {
    return this.tokens.length - this.pos;
  }
}
