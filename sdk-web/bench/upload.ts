// What sealing and anonymous tokens cost per upload, in Node. Usage: npm run bench:upload (prints JSON).
//
// * seal: `sealRecords` + `encodeSealedFrame` of one batch of n GRR records (each record its own HPKE
//   message to the analyzer key: an X25519 key pair, one exchange, HKDF, AES-128-GCM), n = 1, 10, 100;
// * token spending per upload: the wallet's `tokenFor` (one IndexedDB transaction binding a free token to the
//   batch, fake-indexeddb) and `settle` (deleting it once delivered), plus the Authorization header;
// * token issuance per token, device side: blind + finalize (RSABSSA-SHA384-PSS-Deterministic, RSA-2048,
//   @cloudflare/blindrsa-ts), with the issuer's blind signature (Web Crypto key) outside the timing.
// Each: warm-up, then 31 samples; median and p90 per upload (or per token).
import { IDBFactory } from "fake-indexeddb";
import { performance } from "node:perf_hooks";
import { RSABSSA } from "@cloudflare/blindrsa-ts";
import { x25519 } from "@noble/curves/ed25519.js";
import { AnalyzerPublicKey, encodeSealedFrame, keyIdOf, sealRecords } from "../src/sealing.js";
import { openDatabase, req, transaction, type TokenRow } from "../src/store.js";
import { TokenWallet } from "../src/wallet.js";
import { IssuerClient, DeviceIdentity, b64 } from "../src/tokens.js";
import { ed25519 } from "@noble/curves/ed25519.js";

const SAMPLES = 31;
function stats(xs: number[]): { p50: number; p90: number } {
  const s = [...xs].sort((a, b) => a - b);
  const at = (q: number): number => Number((s[Math.min(s.length - 1, Math.floor(q * s.length))] as number).toFixed(3));
  return { p50: at(0.5), p90: at(0.9) };
}
async function time(fn: () => Promise<unknown>, warm = 3): Promise<number[]> {
  for (let i = 0; i < warm; i++) await fn();
  const out: number[] = [];
  for (let i = 0; i < SAMPLES; i++) {
    const t = performance.now();
    await fn();
    out.push(performance.now() - t);
  }
  return out;
}

const pk = x25519.getPublicKey(x25519.utils.randomSecretKey());
const key = new AnalyzerPublicKey(keyIdOf(pk), pk);
const seal: Record<string, unknown> = {};
for (const n of [1, 10, 100]) {
  const recs = Array.from({ length: n }, (_, i) => Uint8Array.of(i % 8));
  const ms = await time(async () => encodeSealedFrame("bench_metric", "9c7d975a04c02fee", 20_000, await sealRecords(recs, "bench_metric", "9c7d975a04c02fee", 20_000, key), 1, new Uint8Array(16)));
  const st = stats(ms);
  seal[`records_${n}`] = { ms_per_upload: st, us_per_record_p50: Number(((st.p50 * 1000) / n).toFixed(1)) };
}

// token spending: a wallet over fake-indexeddb with a stock of tokens (random bytes: spending does not verify)
const db = await openDatabase(new IDBFactory(), "bench");
const sk = crypto.getRandomValues(new Uint8Array(32));
const identity = new DeviceIdentity(sk, { v: 1, device_id: "bench", public_key: b64(ed25519.getPublicKey(sk)), issued_at: 0, expires_at: 2 ** 31, authority: "0".repeat(16), signature: b64(new Uint8Array(64)) });
const today = Math.floor(Date.now() / 86_400_000);
const wallet = new TokenWallet(() => db, new IssuerClient({ issuerUrl: "http://127.0.0.1:9", identity, origin: "bench", collectorUrl: "http://127.0.0.1:9" }), {
  stock: 16,
  clock: () => Date.now(),
  backoff: () => 1000,
  count: () => undefined,
});
let k = 0;
async function stock(n: number): Promise<void> {
  await transaction(db, ["tokens"], "readwrite", async (tx) => {
    for (let i = 0; i < n; i++) {
      const t = crypto.getRandomValues(new Uint8Array(354));
      await req(tx.objectStore("tokens").put({ id: `t${k++}`, token: t, day: today, batchId: null, fetched: k } satisfies TokenRow));
    }
  });
}
await stock(16);
const spend = await time(async () => {
  const id = `b${k++}`;
  const header = await wallet.tokenFor(id, today);
  if (header === null) throw new Error("no token");
  await wallet.settle(id);
  await stock(1); // outside a real upload; keeps the stock at 16 (timed: an upper bound)
});
const stockOnly = await time(() => stock(1));
await transaction(db, ["tokens"], "readwrite", async (tx) => req(tx.objectStore("tokens").clear()));

// issuance, device side
const suite = RSABSSA.SHA384.PSS.Deterministic();
const pair = (await crypto.subtle.generateKey({ name: "RSA-PSS", modulusLength: 2048, publicExponent: new Uint8Array([1, 0, 1]), hash: "SHA-384" }, true, ["sign", "verify"])) as CryptoKeyPair;
let blindMs: number[] = [];
let finalizeMs: number[] = [];
for (let i = 0; i < SAMPLES + 3; i++) {
  const msg = crypto.getRandomValues(new Uint8Array(98));
  let t = performance.now();
  const { blindedMsg, inv } = await suite.blind(pair.publicKey, msg);
  const b = performance.now() - t;
  const sig = await suite.blindSign(pair.privateKey, blindedMsg);
  t = performance.now();
  await suite.finalize(pair.publicKey, msg, sig, inv);
  const f = performance.now() - t;
  if (i >= 3) {
    blindMs.push(b);
    finalizeMs.push(f);
  }
}
const spendMinusStock = stats(spend.map((x, i) => x - (stockOnly[i] ?? 0)));
process.stdout.write(
  JSON.stringify(
    {
      runtime: `node ${process.version}`,
      seal_ms: seal,
      token_spend_ms_per_upload: { tokenFor_settle_plus_restock: stats(spend), restock_alone: stats(stockOnly), tokenFor_settle_estimate: spendMinusStock },
      token_issuance_ms_per_token: { blind: stats(blindMs), finalize: stats(finalizeMs) },
    },
    null,
    1,
  ) + "\n",
);
