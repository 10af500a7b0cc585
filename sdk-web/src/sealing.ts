/**
 * Sealed records, byte-compatible with ldp_core/wire/sealing.py (docs/SEALED.md).
 *
 * A sealed metric's privatized record is encrypted on the device to the analyzer's X25519 key with a
 * single-shot HPKE base-mode message (RFC 9180: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM),
 * a fresh ephemeral key per record, an empty aad, and `info` binding the metric, spec, day and key:
 *
 *     offset size    field
 *     0      4       key id = SHA-256("ldp-analyzer-key/1" || pkR)[0:4]
 *     4      32      enc: the record's ephemeral X25519 public key
 *     36     R + 16  AES-128-GCM ciphertext of the R-byte record, tag last
 *
 * The HPKE is `@hpke/core` with `@hpke/dhkem-x25519` (a maintained RFC 9180 implementation; the X25519
 * extension runs where Web Crypto has no X25519). Sealing is asynchronous (Web Crypto), so the client
 * seals when it forms a batch, outside any IndexedDB transaction.
 */
import { Aes128Gcm, CipherSuite, HkdfSha256 } from "@hpke/core";
import { DhkemX25519HkdfSha256 } from "@hpke/dhkem-x25519";
import { sha256 } from "@noble/hashes/sha2.js";
import { LDPError } from "./errors.js";
import { utf8 } from "./hashing.js";
import { fromHex, hex } from "./mechanisms/base.js";
import { FLAG_SEALED, HEADER_SIZE, MAGIC, VERSION, crc32 } from "./wire.js";

export const KEY_ID_SIZE = 4;
export const ENC_SIZE = 32;
export const TAG_SIZE = 16;
/** Bytes a sealed record carries beyond the plain one: key id, enc, AEAD tag. */
export const SEALED_OVERHEAD = KEY_ID_SIZE + ENC_SIZE + TAG_SIZE;
const KEY_ID_LABEL = utf8("ldp-analyzer-key/1");
const INFO_LABEL = utf8("ldp-sealed-report/1");

/** A key, a key entry or a sealed metric's configuration is unusable; the message says which and why. */
export class SealingError extends LDPError {}

/** The 8-hex-digit id of an analyzer public key (raw 32-byte X25519). */
export function keyIdOf(publicKey: Uint8Array): string {
  const buf = new Uint8Array(KEY_ID_LABEL.length + publicKey.length);
  buf.set(KEY_ID_LABEL);
  buf.set(publicKey, KEY_ID_LABEL.length);
  return hex(sha256(buf).subarray(0, KEY_ID_SIZE));
}

/** HPKE `info` of a sealed record: label, u8 metric length, metric, spec id (8 bytes), day (u32 LE), key id. */
export function sealedInfo(metric: string, specId: string, day: number, keyId: string): Uint8Array {
  const m = utf8(metric);
  if (m.length > 255) throw new SealingError(`metric name ${JSON.stringify(metric)} is longer than 255 bytes`);
  const out = new Uint8Array(INFO_LABEL.length + 1 + m.length + 8 + 4 + KEY_ID_SIZE);
  let p = 0;
  out.set(INFO_LABEL, p);
  p += INFO_LABEL.length;
  out[p++] = m.length;
  out.set(m, p);
  p += m.length;
  out.set(fromHex(specId), p);
  p += 8;
  new DataView(out.buffer).setUint32(p, day, true);
  p += 4;
  out.set(fromHex(keyId), p);
  return out;
}

/** An analyzer public key as a metrics file names it: `{"key_id": "<8 hex>", "public_key": "<64 hex>"}`. */
export class AnalyzerPublicKey {
  readonly keyId: string;
  readonly publicKey: Uint8Array;

  constructor(keyId: string, publicKey: Uint8Array) {
    if (!(publicKey instanceof Uint8Array) || publicKey.length !== 32) throw new SealingError("an analyzer public key is 32 bytes (X25519)");
    const actual = keyIdOf(publicKey);
    if (actual !== keyId) throw new SealingError(`analyzer key id ${JSON.stringify(keyId)} does not match its public key (its id is ${actual}); copy both from \`ldp keys new\``);
    this.keyId = keyId;
    this.publicKey = Uint8Array.from(publicKey);
  }

  static fromDict(data: unknown): AnalyzerPublicKey {
    const keys = data !== null && typeof data === "object" && !Array.isArray(data) ? Object.keys(data).sort() : [];
    if (keys.length !== 2 || keys[0] !== "key_id" || keys[1] !== "public_key") {
      throw new SealingError('an analyzer key is {"key_id": "<8 hex>", "public_key": "<64 hex>"} and nothing else (private keys never go in the metrics file)');
    }
    const { key_id: kid, public_key: pub } = data as Record<string, unknown>;
    if (typeof kid !== "string" || !/^[0-9a-f]{8}$/.test(kid)) throw new SealingError(`analyzer key_id must be 8 lowercase hex digits, got ${JSON.stringify(kid)}`);
    if (typeof pub !== "string" || !/^[0-9a-f]{64}$/.test(pub)) throw new SealingError(`analyzer key ${kid}: public_key must be 64 lowercase hex digits`);
    return new AnalyzerPublicKey(kid, fromHex(pub));
  }

  toDict(): { key_id: string; public_key: string } {
    return { key_id: this.keyId, public_key: hex(this.publicKey) };
  }

  equals(other: AnalyzerPublicKey | null | undefined): boolean {
    return !!other && other.keyId === this.keyId && hex(other.publicKey) === hex(this.publicKey);
  }
}

/** The metrics file's `analyzer_keys` (the current key first); a clear SealingError if one entry is bad. */
export function parseAnalyzerKeys(raw: unknown): AnalyzerPublicKey[] {
  if (raw === undefined) return [];
  if (!Array.isArray(raw)) throw new SealingError('analyzer_keys must be a list of {"key_id", "public_key"} entries, the current key first');
  const out = raw.map((e) => AnalyzerPublicKey.fromDict(e));
  const ids = new Set(out.map((k) => k.keyId));
  if (ids.size !== out.length) throw new SealingError("analyzer_keys lists a key twice");
  return out;
}

let suiteInstance: CipherSuite | null = null;

/** The one HPKE suite of sealed records: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM. */
export function sealedSuite(): CipherSuite {
  suiteInstance ??= new CipherSuite({ kem: new DhkemX25519HkdfSha256(), kdf: new HkdfSha256(), aead: new Aes128Gcm() });
  return suiteInstance;
}

const recipientKeys = new Map<string, Promise<CryptoKey>>();

function recipientKey(key: AnalyzerPublicKey): Promise<CryptoKey> {
  let k = recipientKeys.get(key.keyId);
  if (!k) {
    k = sealedSuite().kem.deserializePublicKey(key.publicKey.slice().buffer as ArrayBuffer);
    recipientKeys.set(key.keyId, k);
  }
  return k;
}

/**
 * Seal each of `records` (each the spec's R bytes) to `key`, each under a fresh ephemeral key from the
 * platform CSPRNG; returns the sealed records concatenated (n · (R + 52) bytes).
 */
export async function sealRecords(records: readonly Uint8Array[], metric: string, specId: string, day: number, key: AnalyzerPublicKey): Promise<Uint8Array> {
  const suite = sealedSuite();
  const info = sealedInfo(metric, specId, day, key.keyId);
  const pk = await recipientKey(key);
  const kid = fromHex(key.keyId);
  const width = (records[0]?.length ?? 0) + SEALED_OVERHEAD;
  const out = new Uint8Array(records.length * width);
  for (let i = 0; i < records.length; i++) {
    const rec = records[i] as Uint8Array;
    if (rec.length + SEALED_OVERHEAD !== width) throw new SealingError(`record ${i} has ${rec.length} bytes; the others have ${width - SEALED_OVERHEAD}`);
    const { ct, enc } = await suite.seal({ recipientPublicKey: pk, info: info.slice().buffer as ArrayBuffer }, rec.slice().buffer as ArrayBuffer);
    const e = new Uint8Array(enc);
    const c = new Uint8Array(ct);
    if (e.length !== ENC_SIZE || c.length !== rec.length + TAG_SIZE) throw new SealingError(`HPKE produced ${e.length} + ${c.length} bytes for a ${rec.length}-byte record`);
    const at = i * width;
    out.set(kid, at);
    out.set(e, at + KEY_ID_SIZE);
    out.set(c, at + KEY_ID_SIZE + ENC_SIZE);
  }
  return out;
}

/**
 * Open one sealed record with the analyzer's raw X25519 private key (the analyzer's side; here for tests
 * and tools). Throws SealingError if it does not open (another key, metric, spec or day, altered bytes).
 */
export async function openRecord(sealed: Uint8Array, privateKey: Uint8Array, metric: string, specId: string, day: number): Promise<Uint8Array> {
  if (sealed.length < SEALED_OVERHEAD) throw new SealingError(`a sealed record has at least ${SEALED_OVERHEAD} bytes, got ${sealed.length}`);
  const suite = sealedSuite();
  const keyId = hex(sealed.subarray(0, KEY_ID_SIZE));
  const sk = await suite.kem.importKey("raw", privateKey.slice().buffer as ArrayBuffer, false);
  try {
    const pt = await suite.open(
      {
        recipientKey: sk,
        enc: sealed.slice(KEY_ID_SIZE, KEY_ID_SIZE + ENC_SIZE).buffer as ArrayBuffer,
        info: sealedInfo(metric, specId, day, keyId).slice().buffer as ArrayBuffer,
      },
      sealed.slice(KEY_ID_SIZE + ENC_SIZE).buffer as ArrayBuffer,
    );
    return new Uint8Array(pt);
  } catch {
    throw new SealingError("the sealed record does not open: wrong key, metric, spec or day, or altered bytes");
  }
}

/** A v1 frame with flag 1 (sealed records of `plainRecordSize + 52` bytes each), byte for byte as Python's. */
export function encodeSealedFrame(metric: string, specId: string, day: number, sealed: Uint8Array, plainRecordSize: number, batchId: Uint8Array): Uint8Array {
  const m = utf8(metric);
  const width = plainRecordSize + SEALED_OVERHEAD;
  if (sealed.length % width) throw new SealingError(`${sealed.length} sealed bytes are not a whole number of ${width}-byte records`);
  if (batchId.length !== 16) throw new SealingError("batch_id must be 16 bytes");
  const size = HEADER_SIZE + m.length + sealed.length + 4;
  const out = new Uint8Array(size);
  const dv = new DataView(out.buffer);
  out.set(MAGIC, 0);
  out[4] = VERSION;
  out[5] = FLAG_SEALED;
  dv.setUint16(6, m.length, true);
  out.set(fromHex(specId), 8);
  dv.setUint32(16, day, true);
  dv.setUint32(20, width, true);
  dv.setUint32(24, sealed.length / width, true);
  out.set(batchId, 28);
  out.set(m, HEADER_SIZE);
  out.set(sealed, HEADER_SIZE + m.length);
  dv.setUint32(size - 4, crc32(out.subarray(0, size - 4)), true);
  return out;
}
