// Sealed records against Python (docs/SEALED.md): the TS side opens the frame Python sealed
// (ldp_core/vectors/sealed_frame.json), reproduces its info bytes and key id, and what it seals opens
// with the same private key only under the same metric, spec and day. The other direction (Python
// opens what TS seals) is tests/web/test_web_sealing.py, which runs test/interop/seal.ts.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { fromHex, hex } from "../src/mechanisms/base.js";
import { readHeader } from "../src/wire.js";
import { AnalyzerPublicKey, SEALED_OVERHEAD, SealingError, encodeSealedFrame, keyIdOf, openRecord, sealRecords, sealedInfo } from "../src/sealing.js";

const V = JSON.parse(readFileSync(new URL("../../ldp_core/vectors/sealed_frame.json", import.meta.url), "utf8")) as Record<string, string | number>;
const str = (k: string): string => V[k] as string;

test("the key id and info bytes are Python's", () => {
  assert.equal(keyIdOf(fromHex(str("public_key"))), V.key_id);
  assert.equal(hex(sealedInfo(str("metric"), str("spec_id"), V.day as number, str("key_id"))), V.info_hex);
});

test("a frame Python sealed opens here to its plain records", async () => {
  const frame = fromHex(str("frame_hex"));
  const h = readHeader(frame);
  assert.equal(h.sealed, true);
  assert.equal(h.recordSize, V.sealed_record_size);
  const start = frame.length - 4 - h.nRecords * h.recordSize;
  const plain: string[] = [];
  for (let i = 0; i < h.nRecords; i++) {
    const rec = frame.subarray(start + i * h.recordSize, start + (i + 1) * h.recordSize);
    plain.push(hex(await openRecord(rec, fromHex(str("private_key")), h.metric, h.specId, h.day)));
  }
  assert.equal(plain.join(""), V.plain_records_hex);
});

test("what TS seals opens with the key, and only under its own metric, spec and day", async () => {
  const key = new AnalyzerPublicKey(str("key_id"), fromHex(str("public_key")));
  const recs = [Uint8Array.of(1), Uint8Array.of(5), Uint8Array.of(7)];
  const sealed = await sealRecords(recs, str("metric"), str("spec_id"), 20000, key);
  assert.equal(sealed.length, 3 * (1 + SEALED_OVERHEAD));
  const sk = fromHex(str("private_key"));
  const encs = new Set<string>();
  for (let i = 0; i < 3; i++) {
    const rec = sealed.subarray(i * 53, (i + 1) * 53);
    encs.add(hex(rec.subarray(4, 36)));
    assert.deepEqual(await openRecord(rec, sk, str("metric"), str("spec_id"), 20000), recs[i]);
    await assert.rejects(openRecord(rec, sk, str("metric"), str("spec_id"), 20001), SealingError);
    await assert.rejects(openRecord(rec, sk, "other_metric", str("spec_id"), 20000), SealingError);
  }
  assert.equal(encs.size, 3, "every record has its own ephemeral key");
  const frame = encodeSealedFrame(str("metric"), str("spec_id"), 20000, sealed, 1, fromHex(str("batch_id")));
  const h = readHeader(frame);
  assert.equal(h.sealed, true);
  assert.equal(h.nRecords, 3);
  // Same header bytes as the Python frame (only the sealed records, fresh per seal, differ).
  assert.equal(hex(frame.subarray(0, 54)), str("frame_hex").slice(0, 108));
});

test("a bad analyzer key entry is refused with what to do", () => {
  assert.throws(() => AnalyzerPublicKey.fromDict({ key_id: "00000000", public_key: str("public_key") }), /does not match its public key/);
  assert.throws(() => AnalyzerPublicKey.fromDict({ key_id: str("key_id"), public_key: str("public_key"), private_key: "x" }), /private keys never go/);
});
