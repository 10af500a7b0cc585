/**
 * Heavy-hitter discovery over strings, device side, as ldp_core/mechanisms/heavy_hitters.py: PEM
 * (prefix extending, Wang et al., IEEE TDSC 2019) and Apple's SFP (Sequence Fragment Puzzle).
 *
 * A value becomes `length` bytes ({@link padValue}: UTF-8, padded with 0x00). PEM: a device sits at
 * one level for good (HMAC-SHA256 of its device secret and the spec id, mod L) and reports the 31-bit
 * key of its value's prefix at that level through OLH (Python's batch OLH draws: seed, float, and an
 * integer always) or HCMS; record `(level, seed, y)` or `(level, row, col, bit)`. SFP: a uniform
 * position, then a count-mean sketch (CMS or HCMS) of (8-bit-ish tag of the word, 2-byte fragment)
 * at ε(1 − word_share) and one of the whole word's key at ε·word_share.
 *
 * `end_marker: 1` (docs/HEAVY_HITTERS.md; /work/helpers/HH_SPEC.md) makes 0x00 the end-of-value
 * marker: such a metric also refuses control characters U+0001..U+001F and U+007F. The encoders are
 * unchanged; the parameter is in the spec (and its id) only when it is 1.
 */
import { hmac } from "@noble/hashes/hmac.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { DomainError, SpecError } from "../errors.js";
import { hashToRange, utf8, xxh32U32 } from "../hashing.js";
import type { RandomSource } from "../random.js";
import { ReportSpec, indexSize, packRecord, requireInt, type Param, type RecordField } from "./base.js";
import { CMSSpec, HCMSSpec } from "./cms.js";
import { MAX_G, defaultG } from "./olh.js";

export const KEY_DOMAIN = 2 ** 31;
export const MAX_LENGTH = 64;
const LEVEL_CONTEXT = utf8("ldp/pem-level/v1/");

export type Overflow = "truncate" | "refuse";

function requireOverflow(spec: string, v: unknown): Overflow {
  if (v !== "truncate" && v !== "refuse") throw new SpecError(`${spec}: overflow must be 'truncate' or 'refuse', got ${JSON.stringify(v)}`);
  return v;
}

export function requireEndMarker(spec: string, v: unknown): 0 | 1 {
  if (v === undefined || v === null) return 0;
  if (v !== 0 && v !== 1) throw new SpecError(`${spec}: end_marker must be 0 or 1, got ${JSON.stringify(v)}`);
  return v;
}

/** `value` as exactly `length` bytes: UTF-8 padded with 0x00 (Python's `pad_value`); DomainError when refused. */
export function padValue(value: unknown, length: number, overflow: Overflow = "truncate", endMarker: 0 | 1 = 0): Uint8Array {
  if (typeof value !== "string") throw new DomainError(`a heavy-hitter value is a string, got ${value === null ? "null" : typeof value}`);
  if (/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(value)) throw new DomainError("value is not valid Unicode (a lone surrogate)");
  let data = utf8(value);
  if (data.includes(0)) throw new DomainError("a heavy-hitter value may not contain NUL characters (NUL is the padding)");
  if (!data.length) throw new DomainError("a heavy-hitter value may not be empty");
  if (endMarker === 1 && data.some((b) => b < 0x20 || b === 0x7f)) {
    throw new DomainError("this heavy-hitter metric (end_marker 1) refuses control characters U+0001..U+001F and U+007F");
  }
  if (data.length > length) {
    if (overflow === "refuse") throw new DomainError(`value is ${data.length} bytes long, above the declared length ${length}`);
    let cut = length;
    while (cut > 0 && ((data[cut] as number) & 0xc0) === 0x80) cut--;
    data = data.subarray(0, cut);
    if (!data.length) throw new DomainError(`value's first character is longer than the declared length ${length}`);
  }
  const out = new Uint8Array(length);
  out.set(data, 0);
  return out;
}

/** The OLH key in [0, 2^31) of the `bits`-bit prefix of one padded value (Python's `prefix_keys`). */
export function prefixKey(padded: Uint8Array, bits: number): number {
  const length = padded.length;
  if (!(bits >= 1 && bits <= 8 * length)) throw new SpecError(`prefix bits must be between 1 and ${8 * length}, got ${bits}`);
  const full = bits >>> 3;
  const rest = bits & 7;
  const nbytes = Math.ceil(bits / 8);
  const words = Math.ceil(length / 4);
  const pre = new Uint8Array(4 * words);
  pre.set(padded.subarray(0, full), 0);
  if (rest) pre[full] = (padded[full] as number) & ((0xff << (8 - rest)) & 0xff);
  if (bits <= 31) {
    let acc = 0;
    for (let i = 0; i < nbytes; i++) acc = acc * 256 + (pre[i] as number);
    return Math.floor(acc / 2 ** (8 * nbytes - bits));
  }
  let h = bits >>> 0;
  const dv = new DataView(pre.buffer);
  for (let w = 0; w < Math.ceil(nbytes / 4); w++) h = xxh32U32(dv.getUint32(4 * w, true), h);
  return h >>> 1;
}

type PEMParams = {
  epsilon: number;
  length?: number;
  start_bits?: number;
  step_bits?: number;
  g?: number | null;
  overflow?: Overflow;
  oracle?: "olh" | "hcms";
  num_hashes?: number | null;
  width?: number | null;
  hash_seed?: number | null;
  end_marker?: number;
};

export class PEMSpec extends ReportSpec {
  readonly name = "pem";
  readonly length: number;
  readonly startBits: number;
  readonly stepBits: number;
  readonly g: number;
  readonly overflow: Overflow;
  readonly oracle: "olh" | "hcms";
  readonly endMarker: 0 | 1;
  readonly hcms: HCMSSpec | null;
  private readonly fields: RecordField[];
  private levelCache: { secret: Uint8Array; level: number } | null = null;

  constructor(params: PEMParams) {
    super("pem", params.epsilon);
    this.length = requireInt("pem", "length", params.length ?? 6, 1, MAX_LENGTH);
    this.startBits = requireInt("pem", "start_bits", params.start_bits ?? 12, 1, Math.min(8 * this.length, 24));
    this.stepBits = requireInt("pem", "step_bits", params.step_bits ?? 4, 1, 16);
    this.overflow = requireOverflow("pem", params.overflow ?? "truncate");
    this.g = params.g === undefined || params.g === null ? defaultG(this.epsilon) : requireInt("pem", "g", params.g, 2, MAX_G);
    const oracle = params.oracle ?? "olh";
    if (oracle !== "olh" && oracle !== "hcms") throw new SpecError(`pem: oracle must be 'olh' or 'hcms', got ${JSON.stringify(oracle)}`);
    this.oracle = oracle;
    this.endMarker = requireEndMarker("pem", params.end_marker);
    if (oracle === "hcms") {
      this.hcms = new HCMSSpec({
        epsilon: this.epsilon,
        domain_size: KEY_DOMAIN,
        num_hashes: params.num_hashes === undefined || params.num_hashes === null ? 64 : requireInt("pem", "num_hashes", params.num_hashes, 1, 2 ** 16),
        width: params.width === undefined || params.width === null ? 1024 : requireInt("pem", "width", params.width, 2, 2 ** 20),
        hash_seed: params.hash_seed === undefined || params.hash_seed === null ? 0 : requireInt("pem", "hash_seed", params.hash_seed, 0, 2 ** 32 - 1),
      });
    } else {
      if (params.num_hashes != null || params.width != null || params.hash_seed != null) {
        throw new SpecError("pem: num_hashes, width and hash_seed are parameters of oracle 'hcms'; this spec's oracle is 'olh'");
      }
      this.hcms = null;
    }
    if (this.numLevels > 255) throw new SpecError(`pem: ${this.numLevels} levels is above 255; raise step_bits`);
    const level: RecordField = { name: "level", kind: "uint", size: 1, bound: this.numLevels };
    this.fields = this.hcms
      ? [level, ...this.hcms.recordFields]
      : [level, { name: "seed", kind: "uint", size: 4 }, { name: "y", kind: "uint", size: indexSize(this.g), bound: this.g }];
  }
  override get kind(): string {
    return "heavy_hitters";
  }
  protected ownParams(): [string, Param][] {
    const out: [string, Param][] = [
      ["length", { value: this.length }],
      ["start_bits", { value: this.startBits }],
      ["step_bits", { value: this.stepBits }],
      ["g", { value: this.g }],
      ["overflow", { value: this.overflow }],
    ];
    if (this.hcms) {
      out.push(["oracle", { value: "hcms" }], ["num_hashes", { value: this.hcms.numHashes }], ["width", { value: this.hcms.width }], ["hash_seed", { value: this.hcms.hashSeed }]);
    }
    if (this.endMarker === 1) out.push(["end_marker", { value: 1 }]);
    return out;
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  get totalBits(): number {
    return 8 * this.length;
  }
  get numLevels(): number {
    return 1 + Math.ceil((this.totalBits - this.startBits) / this.stepBits);
  }
  levelBits(level: number): number {
    return Math.min(this.totalBits, this.startBits + level * this.stepBits);
  }
  /** OLH's p = e^ε/(e^ε + g − 1). */
  get p(): number {
    return this.expEpsilon / (this.expEpsilon + this.g - 1);
  }
  pad(value: unknown): Uint8Array {
    return padValue(value, this.length, this.overflow, this.endMarker);
  }
  /** The device's level, for good: HMAC-SHA256(device secret, "ldp/pem-level/v1/" ‖ spec id) mod L. */
  levelForDevice(deviceSecret: Uint8Array): number {
    if (this.levelCache && this.levelCache.secret === deviceSecret) return this.levelCache.level;
    if (!(deviceSecret instanceof Uint8Array) || deviceSecret.length < 16) throw new SpecError("a device secret must be at least 16 bytes");
    const ctx = new Uint8Array(LEVEL_CONTEXT.length + 16);
    ctx.set(LEVEL_CONTEXT, 0);
    ctx.set(utf8(this.specId), LEVEL_CONTEXT.length);
    let v = 0n;
    for (const b of hmac(sha256, deviceSecret, ctx)) v = (v << 8n) | BigInt(b);
    const level = Number(v % BigInt(this.numLevels));
    this.levelCache = { secret: deviceSecret, level };
    return level;
  }
  /** One report of a padded value at `level` (drawn uniformly from `rng` first when omitted: a simulated device). */
  encodePadded(padded: Uint8Array, rng: RandomSource, level?: number): Uint8Array {
    if (padded.length !== this.length) throw new DomainError(`pem: padded values must have ${this.length} bytes, got ${padded.length}`);
    const lv = level ?? rng.below(this.numLevels);
    if (!(Number.isInteger(lv) && lv >= 0 && lv < this.numLevels)) throw new DomainError(`pem: need a level in [0, ${this.numLevels})`);
    const key = prefixKey(padded, this.levelBits(lv));
    if (this.hcms) {
      const inner = this.hcms.encodeOne(key, rng);
      const out = new Uint8Array(1 + inner.length);
      out[0] = lv;
      out.set(inner, 1);
      return out;
    }
    const seed = rng.below(2 ** 32);
    const hv = hashToRange(key, seed, this.g);
    const keep = rng.float53() < this.p;
    let other = rng.below(this.g - 1);
    if (other >= hv) other += 1;
    return packRecord(this.fields, [lv, seed, keep ? hv : other]);
  }
}

type SFPParams = {
  epsilon: number;
  length?: number;
  sketch?: "cms" | "hcms";
  num_hashes?: number;
  width?: number;
  hash_bits?: number;
  word_share?: number;
  overflow?: Overflow;
  end_marker?: number;
};

export class SFPSpec extends ReportSpec {
  readonly name = "sfp";
  static readonly FRAGMENT = 2;
  readonly length: number;
  readonly sketch: "cms" | "hcms";
  readonly numHashes: number;
  readonly width: number;
  readonly hashBits: number;
  readonly wordShare: number;
  readonly overflow: Overflow;
  readonly endMarker: 0 | 1;
  readonly fragmentSpec: CMSSpec | HCMSSpec;
  readonly wordSpec: CMSSpec | HCMSSpec;
  private readonly fields: RecordField[];

  constructor(params: SFPParams) {
    super("sfp", params.epsilon);
    this.length = requireInt("sfp", "length", params.length ?? 6, 2, MAX_LENGTH);
    if (this.length % SFPSpec.FRAGMENT) throw new SpecError(`sfp: length must be a multiple of ${SFPSpec.FRAGMENT} bytes, got ${this.length}`);
    const sketch = params.sketch ?? "hcms";
    if (sketch !== "cms" && sketch !== "hcms") throw new SpecError(`sfp: sketch must be 'cms' or 'hcms', got ${JSON.stringify(sketch)}`);
    this.sketch = sketch;
    this.hashBits = requireInt("sfp", "hash_bits", params.hash_bits ?? 8, 1, 15);
    const share = params.word_share ?? 0.5;
    if (typeof share !== "number" || !(share > 0 && share < 1)) throw new SpecError(`sfp: word_share must be a number strictly between 0 and 1, got ${JSON.stringify(share)}`);
    this.wordShare = share;
    this.overflow = requireOverflow("sfp", params.overflow ?? "truncate");
    this.endMarker = requireEndMarker("sfp", params.end_marker);
    const make = (epsilon: number, seed: number): CMSSpec | HCMSSpec => {
      const p = { epsilon, domain_size: KEY_DOMAIN, num_hashes: params.num_hashes ?? 256, width: params.width ?? 1024, hash_seed: seed };
      return sketch === "cms" ? new CMSSpec(p) : new HCMSSpec(p);
    };
    this.fragmentSpec = make(this.epsilon * (1.0 - this.wordShare), 0x5f5f0001);
    this.wordSpec = make(this.epsilon * this.wordShare, 0x5f5f0002);
    this.numHashes = this.fragmentSpec.numHashes;
    this.width = this.fragmentSpec.width;
    this.fields = [
      { name: "position", kind: "uint", size: 1, bound: this.numPositions },
      ...this.fragmentSpec.recordFields.map((f) => ({ ...f, name: `f_${f.name}` })),
      ...this.wordSpec.recordFields.map((f) => ({ ...f, name: `w_${f.name}` })),
    ];
  }
  override get kind(): string {
    return "heavy_hitters";
  }
  protected ownParams(): [string, Param][] {
    const out: [string, Param][] = [
      ["length", { value: this.length }],
      ["sketch", { value: this.sketch }],
      ["num_hashes", { value: this.numHashes }],
      ["width", { value: this.width }],
      ["hash_bits", { value: this.hashBits }],
      ["word_share", { value: this.wordShare, float: true }],
      ["overflow", { value: this.overflow }],
    ];
    if (this.endMarker === 1) out.push(["end_marker", { value: 1 }]);
    return out;
  }
  get recordFields(): readonly RecordField[] {
    return this.fields;
  }
  get numPositions(): number {
    return this.length / SFPSpec.FRAGMENT;
  }
  pad(value: unknown): Uint8Array {
    return padValue(value, this.length, this.overflow, this.endMarker);
  }
  wordKey(padded: Uint8Array): number {
    return prefixKey(padded, 8 * this.length);
  }
  wordTag(padded: Uint8Array): number {
    return xxh32U32(this.wordKey(padded), 0x5f5f0003) >>> (32 - this.hashBits);
  }
  /** A fragment report at a uniform position and a word report (draws: position, fragment sketch, word sketch). */
  encodePadded(padded: Uint8Array, rng: RandomSource): Uint8Array {
    if (padded.length !== this.length) throw new DomainError(`sfp: padded values must have ${this.length} bytes, got ${padded.length}`);
    const pos = rng.below(this.numPositions);
    const tag = this.wordTag(padded);
    const frag = ((padded[2 * pos] as number) << 8) | (padded[2 * pos + 1] as number);
    const f = this.fragmentSpec.encodeOne(((tag << 16) | frag) >>> 0, rng);
    const w = this.wordSpec.encodeOne(this.wordKey(padded), rng);
    const out = new Uint8Array(1 + f.length + w.length);
    out[0] = pos;
    out.set(f, 1);
    out.set(w, 1 + f.length);
    return out;
  }
}
