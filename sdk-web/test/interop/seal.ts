// Seal records with the web SDK for tests/web/test_web_sealing.py: argv = metric spec_id day key_id public_key_hex
// records_hex record_size; prints {"frame_hex": ...}, a sealed frame Python must open.
import { fromHex, hex } from "../../src/mechanisms/base.js";
import { AnalyzerPublicKey, encodeSealedFrame, sealRecords } from "../../src/sealing.js";

const [metric, specId, day, keyId, pub, recordsHex, size] = process.argv.slice(2) as [string, string, string, string, string, string, string];
const r = Number(size);
const flat = fromHex(recordsHex);
const recs = Array.from({ length: flat.length / r }, (_, i) => flat.slice(i * r, (i + 1) * r));
const sealed = await sealRecords(recs, metric, specId, Number(day), new AnalyzerPublicKey(keyId, fromHex(pub)));
const batchId = crypto.getRandomValues(new Uint8Array(16));
process.stdout.write(JSON.stringify({ frame_hex: hex(encodeSealedFrame(metric, specId, Number(day), sealed, r, batchId)) }));
