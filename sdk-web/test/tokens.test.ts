// The key-consistency check of docs/TOKENS.md ("Key consistency") against node HTTP servers playing the
// issuer, the collector and a mirror (the real Python issuer and collector: tests/web/test_web_tokens.py).
// The issuer must not get a token request under a key the collector or a mirror does not list, nor under a
// key for a day this device already pinned another key for.
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";
import { sha256 } from "@noble/hashes/sha2.js";
import { ed25519 } from "@noble/curves/ed25519.js";
import { hex } from "../src/mechanisms/base.js";
import { DeviceIdentity, IssuerClient, TokenError, b64, canonicalPy, type KeyPin, type KeyPinStore, type TokenKeyDocument } from "../src/tokens.js";

const DAY = "2026-12-06";

async function rsaKey(): Promise<string> {
  const pair = (await crypto.subtle.generateKey({ name: "RSA-PSS", modulusLength: 2048, publicExponent: new Uint8Array([1, 0, 1]), hash: "SHA-384" }, true, ["sign", "verify"])) as CryptoKeyPair;
  return b64(new Uint8Array(await crypto.subtle.exportKey("spki", pair.publicKey)));
}

function docOf(publicKey: string): TokenKeyDocument {
  const raw = Uint8Array.from(atob(publicKey), (c) => c.charCodeAt(0));
  return { issuer_name: "ldp-issuer", tokens_per_day: 8, keys: [{ day: DAY, token_key_id: hex(sha256(raw)), public_key: publicKey }] };
}

/** Serves `doc()` at GET /v1/token-keys, counts POST /v1/token-requests (answered 503). */
async function serve(doc: () => TokenKeyDocument): Promise<{ url: string; requests: () => number; server: Server }> {
  let requests = 0;
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      if (req.method === "GET" && req.url === "/v1/token-keys") res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(doc()));
      else if (req.method === "POST" && req.url === "/v1/token-requests") {
        requests++;
        res.writeHead(503, { "content-type": "application/json" }).end('{"error":"unavailable","message":"test double"}');
      } else res.writeHead(404).end();
    });
  });
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, requests: () => requests, server };
}

function identity(): DeviceIdentity {
  const sk = crypto.getRandomValues(new Uint8Array(32));
  const credential = { v: 1, device_id: "dev-1", public_key: b64(ed25519.getPublicKey(sk)), issued_at: 0, expires_at: 2 ** 31, authority: "0".repeat(16), signature: b64(new Uint8Array(64)) };
  return new DeviceIdentity(sk, credential);
}

class MemoryPins implements KeyPinStore {
  readonly map = new Map<string, KeyPin>();
  async pinned(day: string): Promise<KeyPin | undefined> {
    return this.map.get(day);
  }
  async pin(day: string, key: KeyPin): Promise<void> {
    if (!this.map.has(day)) this.map.set(day, key);
  }
}

test("a key the collector does not list, a mirror that disagrees, or a changed pin: no token request", async () => {
  const k1 = await rsaKey();
  const k2 = await rsaKey();
  let issuerKey = k1;
  let collectorKey = k1;
  let mirrorKey = k1;
  const issuer = await serve(() => docOf(issuerKey));
  const collector = await serve(() => docOf(collectorKey));
  const mirror = await serve(() => docOf(mirrorKey));
  const pins = new MemoryPins();
  const client = new IssuerClient({ issuerUrl: issuer.url, identity: identity(), origin: "c", collectorUrl: collector.url, mirrors: [`${mirror.url}/v1/token-keys`], pins });
  try {
    // consistent: the key is pinned and the request goes out (the double answers 503)
    await assert.rejects(client.fetchTokens(2, DAY), (e: TokenError) => e.reason === "unavailable");
    assert.equal(issuer.requests(), 1);
    assert.equal(pins.map.get(DAY)?.publicKey, k1);
    // the issuer serves another key than the collector lists
    issuerKey = k2;
    await assert.rejects(client.fetchTokens(2, DAY), (e: TokenError) => e.reason === "inconsistent_key" && /collector does not list/.test(e.message));
    // both serve k2, the mirror still k1
    collectorKey = k2;
    await assert.rejects(client.fetchTokens(2, DAY), (e: TokenError) => e.reason === "inconsistent_key" && /mirror/.test(e.message));
    // all three serve k2: the day's pin (k1) refuses it
    mirrorKey = k2;
    await assert.rejects(client.fetchTokens(2, DAY), (e: TokenError) => e.reason === "inconsistent_key" && /pinned/.test(e.message));
    assert.equal(issuer.requests(), 1, "no token request under an inconsistent key");
  } finally {
    for (const s of [issuer, collector, mirror]) s.server.close();
  }
});

test("the request signature payload is Python's canonical JSON", () => {
  assert.equal(canonicalPy(["POST", "/v1/token-requests", 1700000000, "ab", "cd"]), '["POST","/v1/token-requests",1700000000,"ab","cd"]');
  assert.equal(canonicalPy({ b: 1, a: "é" }), '{"a":"é","b":1}');
});
