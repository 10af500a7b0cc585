/**
 * Anonymous upload tokens for the web SDK, compatible with the Python issuer and collector (docs/TOKENS.md):
 * Privacy Pass publicly verifiable tokens (RFC 9578 §6, token type 0x0002) over RSABSSA-SHA384-PSS-
 * Deterministic blind signatures (RFC 9474, `@cloudflare/blindrsa-ts`), and the device's enrollment
 * signature on its token requests (Ed25519, `@noble/curves`), as ldp_core/tokens/privacy_pass.py and
 * ldp_core/tokens/enrollment.py.
 *
 * - `token = 0x0002 ‖ nonce (32) ‖ challenge_digest (32) ‖ token_key_id (32) ‖ authenticator (256)`, the
 *   challenge binding the issuer, the key's UTC day D and the collector (`--token-origin`): a token pays for
 *   batches of day D only (docs/TOKENS.md, "Key days").
 * - A token request is `0x0002 ‖ last byte of token_key_id ‖ blinded message`, POSTed as
 *   `{"day", "requests": [base64url...]}` with the device's `X-LDP-Device-Credential` and
 *   `X-LDP-Device-Signature` headers (Ed25519 over `"ldp-request-v1" ‖ 0 ‖ canonical JSON of
 *   [method, target, ts, nonce, sha256(body) hex]`).
 * - **Key consistency** (docs/TOKENS.md, "Key consistency"): before asking for tokens of day D, the issuer's
 *   key of D must be the key the collector's `GET /v1/token-keys` (and every mirror) lists for D, token key id
 *   and public key bytes alike, and the key pinned for D on this device if one is; it is then pinned. Anything
 *   else is refused (`TokenError` reason `inconsistent_key`, counted `token_key_inconsistent`) and no token
 *   request is sent under that key.
 */
import { RSABSSA } from "@cloudflare/blindrsa-ts";
import { ed25519 } from "@noble/curves/ed25519.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { LDPError } from "./errors.js";
import { utf8 } from "./hashing.js";
import { fromHex, hex } from "./mechanisms/base.js";

export const TOKEN_TYPE = 0x0002;
export const NONCE_LEN = 32;
export const NK = 256;
export const CREDENTIAL_HEADER = "X-LDP-Device-Credential";
export const SIGNATURE_HEADER = "X-LDP-Device-Signature";
const REQUEST_TAG = utf8("ldp-request-v1");

/**
 * A token step failed; `reason` is short and machine-readable: `limit` (the issuer's K tokens of the day are
 * issued), `unavailable` (issuer or collector unreachable, or 5xx), `unauthenticated` (the enrollment was
 * refused), `refused` (any other answer), `inconsistent_key`, `malformed`.
 */
export class TokenError extends LDPError {
  constructor(
    readonly reason: string,
    message: string,
    /** Seconds the issuer asked to wait (Retry-After), when it said. */
    readonly retryAfter: number | null = null,
  ) {
    super(message);
  }
}

// ------------------------------------------------------------------ small encodings
export function b64(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s);
}

export function b64url(bytes: Uint8Array): string {
  return b64(bytes).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

export function unb64(text: string): Uint8Array {
  const t = text.replace(/-/g, "+").replace(/_/g, "/");
  const bin = atob(t + "=".repeat((4 - (t.length % 4)) % 4));
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((a, p) => a + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** `YYYY-MM-DD` of a day number (days since 1970-01-01, UTC). */
export function isoDay(day: number): string {
  return new Date(day * 86_400_000).toISOString().slice(0, 10);
}

/** Python's `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)` of JSON values. */
export function canonicalPy(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalPy).join(",")}]`;
  if (v !== null && typeof v === "object") {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalPy(o[k])}`)
      .join(",")}}`;
  }
  if (typeof v === "number" && !Number.isInteger(v)) throw new TokenError("malformed", "only integers are signed here");
  return JSON.stringify(v);
}

// ------------------------------------------------------------------ enrollment
/**
 * An enrolled device: its Ed25519 key, its credential and the authority's public key, read from the bundle
 * `ldp issuer enroll` writes (`{"kind": "ldp-device-identity", "v": 1, "private_key", "credential",
 * "authority_key"}`). Keep the bundle where the app keeps secrets: whoever holds it spends this device's K
 * tokens a day.
 */
export class DeviceIdentity {
  private readonly secret: Uint8Array;
  readonly credential: Record<string, unknown>;
  readonly deviceId: string;
  private readonly credentialHeader: string;

  constructor(secret: Uint8Array, credential: Record<string, unknown>) {
    if (secret.length !== 32) throw new TokenError("malformed", "a device private key is 32 bytes (Ed25519)");
    const pub = credential.public_key;
    if (typeof pub !== "string" || b64(ed25519.getPublicKey(secret)) !== pub) {
      throw new TokenError("malformed", "the enrollment credential is for another key than this device's: use the bundle `ldp issuer enroll` wrote for this device, unchanged");
    }
    if (typeof credential.device_id !== "string") throw new TokenError("malformed", "the enrollment credential has no device_id");
    this.secret = Uint8Array.from(secret);
    this.credential = credential;
    this.deviceId = credential.device_id;
    this.credentialHeader = b64url(utf8(canonicalPy(credential)));
  }

  /** The device bundle (parsed JSON or its text) that `ldp issuer enroll --out DIR` writes. */
  static fromBundle(bundle: string | Record<string, unknown>): DeviceIdentity {
    let o: unknown = bundle;
    if (typeof bundle === "string") {
      try {
        o = JSON.parse(bundle);
      } catch {
        throw new TokenError("malformed", "the device bundle is not JSON: pass the file `ldp issuer enroll` wrote");
      }
    }
    const d = o as Record<string, unknown>;
    if (!d || d.kind !== "ldp-device-identity" || d.v !== 1) throw new TokenError("malformed", 'not an enrolled device bundle ({"kind": "ldp-device-identity", "v": 1, ...} from `ldp issuer enroll`)');
    if (typeof d.private_key !== "string" || typeof d.credential !== "object" || d.credential === null) throw new TokenError("malformed", "the device bundle lacks private_key or credential");
    return new DeviceIdentity(unb64(d.private_key), d.credential as Record<string, unknown>);
  }

  /** The two headers that authenticate one request (`target`: path and query as sent). */
  signRequest(method: string, target: string, body: Uint8Array, nowSeconds: number, nonce?: string): Record<string, string> {
    const ts = Math.floor(nowSeconds);
    const n = nonce ?? hex(crypto.getRandomValues(new Uint8Array(16)));
    const payload = utf8(canonicalPy([method.toUpperCase(), target, ts, n, hex(sha256(body))]));
    const sig = ed25519.sign(concat(REQUEST_TAG, Uint8Array.of(0), payload), this.secret);
    return { [CREDENTIAL_HEADER]: this.credentialHeader, [SIGNATURE_HEADER]: `ts=${ts};nonce=${n};sig=${b64(sig)}` };
  }
}

// ------------------------------------------------------------------ Privacy Pass
/** SHA-256 of the TokenChallenge binding `day` (YYYY-MM-DD, UTC) and the collector `origin` (privacy_pass.py). */
export function challengeDigest(issuerName: string, day: string, origin: string): Uint8Array {
  const issuer = utf8(issuerName);
  const o = utf8(origin);
  const context = sha256(concat(utf8("ldp-token-day-v1"), Uint8Array.of(0), utf8(day)));
  const u16 = (n: number): Uint8Array => Uint8Array.of(n >> 8, n & 0xff);
  return sha256(concat(u16(TOKEN_TYPE), u16(issuer.length), issuer, Uint8Array.of(context.length), context, u16(o.length), o));
}

export function tokenInput(nonce: Uint8Array, digest: Uint8Array, keyId: Uint8Array): Uint8Array {
  return concat(Uint8Array.of(TOKEN_TYPE >> 8, TOKEN_TYPE & 0xff), nonce, digest, keyId);
}

export function authorizationHeader(token: Uint8Array): string {
  return `PrivateToken token=${b64url(token)}`;
}

/** One day key as `GET /v1/token-keys` lists it. */
export interface TokenKeyEntry {
  day: string;
  token_key_id: string;
  public_key: string;
}

export interface TokenKeyDocument {
  issuer_name: string;
  tokens_per_day: number | null;
  keys: TokenKeyEntry[];
}

function parseKeyDocument(data: unknown, where: string): TokenKeyDocument {
  const d = data as Partial<TokenKeyDocument>;
  if (!d || typeof d.issuer_name !== "string" || !Array.isArray(d.keys)) throw new TokenError("refused", `${where} did not serve a token-key document ({"issuer_name", "tokens_per_day", "keys"})`);
  for (const k of d.keys) {
    if (!k || typeof k.day !== "string" || typeof k.token_key_id !== "string" || typeof k.public_key !== "string") throw new TokenError("refused", `${where} lists a malformed key entry`);
  }
  return { issuer_name: d.issuer_name, tokens_per_day: typeof d.tokens_per_day === "number" ? d.tokens_per_day : null, keys: d.keys };
}

// id-RSASSA-PSS SubjectPublicKeyInfo (what the issuer publishes) -> rsaEncryption SPKI (what Web Crypto imports).
const RSA_ENCRYPTION_ALG = Uint8Array.of(0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00);

function derLength(n: number): Uint8Array {
  if (n < 0x80) return Uint8Array.of(n);
  const bytes: number[] = [];
  for (let x = n; x > 0; x = Math.floor(x / 256)) bytes.unshift(x & 0xff);
  return Uint8Array.of(0x80 | bytes.length, ...bytes);
}

function derRead(buf: Uint8Array, pos: number, tag: number): { body: [number, number]; end: number } {
  if (buf[pos] !== tag) throw new TokenError("malformed", "the issuer's public key is not a DER SubjectPublicKeyInfo");
  let len = buf[pos + 1] as number;
  let at = pos + 2;
  if (len & 0x80) {
    const k = len & 0x7f;
    len = 0;
    for (let i = 0; i < k; i++) len = len * 256 + (buf[at + i] as number);
    at += k;
  }
  if (at + len > buf.length) throw new TokenError("malformed", "the issuer's public key is truncated");
  return { body: [at, at + len], end: at + len };
}

/** The rsaEncryption form of an RSA SubjectPublicKeyInfo (either form in; the key bits unchanged). */
export function rsaEncryptionSpki(spki: Uint8Array): Uint8Array {
  const outer = derRead(spki, 0, 0x30);
  const alg = derRead(spki, outer.body[0], 0x30);
  const bits = derRead(spki, alg.end, 0x03);
  const bitString = spki.subarray(alg.end, bits.end);
  const inner = concat(RSA_ENCRYPTION_ALG, bitString);
  return concat(Uint8Array.of(0x30), derLength(inner.length), inner);
}

const SUITE = RSABSSA.SHA384.PSS.Deterministic();

async function importTokenKey(spki: Uint8Array): Promise<CryptoKey> {
  return crypto.subtle.importKey("spki", rsaEncryptionSpki(spki) as BufferSource, { name: "RSA-PSS", hash: "SHA-384" }, true, ["verify"]);
}

/** What the device keeps of each day's key: the day's token key id and public key (base64 SPKI). */
export interface KeyPin {
  tokenKeyId: string;
  publicKey: string;
}

/** Where the device pins the token key of each day (the wallet keeps them in IndexedDB). */
export interface KeyPinStore {
  pinned(day: string): Promise<KeyPin | undefined>;
  pin(day: string, key: KeyPin): Promise<void>;
}

export interface IssuerClientOptions {
  /** The issuer's base URL (`ldp issuer serve`). */
  issuerUrl: string;
  identity: DeviceIdentity;
  /** The collector's name its tokens are bound to (`ldp collector --token-origin`). */
  origin: string;
  /** Where the collector serves `GET /v1/token-keys` (the collector this device uploads to). */
  collectorUrl: string;
  /** Further URLs serving the same document (e.g. a third party): each must agree. */
  mirrors?: readonly string[];
  fetch?: typeof fetch;
  pins?: KeyPinStore;
  /** Milliseconds since the epoch (the request signatures' time). */
  clock?: () => number;
}

/** Fetches tokens from `ldp issuer` as the enrolled device, after the key-consistency check. */
export class IssuerClient {
  readonly issuerUrl: string;
  private readonly fetchImpl: typeof fetch;
  private readonly clock: () => number;
  pins: KeyPinStore | null;

  constructor(private readonly options: IssuerClientOptions) {
    this.issuerUrl = options.issuerUrl.replace(/\/+$/, "");
    this.fetchImpl = (options.fetch ?? globalThis.fetch).bind(globalThis) as typeof fetch;
    this.clock = options.clock ?? (() => Date.now());
    this.pins = options.pins ?? null;
  }

  private async call(url: string, init: RequestInit, what: string): Promise<unknown> {
    let resp: Response;
    try {
      resp = await this.fetchImpl(url, { ...init, credentials: "omit" });
    } catch (e) {
      throw new TokenError("unavailable", `${what} at ${url} cannot be reached (${(e as Error).message}); is it running, and does it allow this page's origin (--allow-origin)?`);
    }
    const text = await resp.text().catch(() => "");
    if (resp.status !== 200) {
      let message = text.slice(0, 300);
      try {
        const body = JSON.parse(text) as { message?: unknown };
        if (typeof body.message === "string") message = body.message;
      } catch {
        /* not JSON */
      }
      const reason = resp.status === 401 ? "unauthenticated" : resp.status === 429 ? "limit" : resp.status >= 500 ? "unavailable" : "refused";
      const ra = resp.headers.get("Retry-After");
      throw new TokenError(reason, `${what} answered ${resp.status}: ${message}`, ra !== null && /^\d+$/.test(ra.trim()) ? Number(ra) : null);
    }
    try {
      return JSON.parse(text);
    } catch {
      throw new TokenError("refused", `${what} at ${url} did not answer JSON`);
    }
  }

  /** The key document at `url`. */
  async keyDocument(url: string, what: string): Promise<TokenKeyDocument> {
    return parseKeyDocument(await this.call(url, { method: "GET", headers: { Accept: "application/json" } }, what), what);
  }

  /**
   * The issuer's key of `day`, checked against the collector's list, every mirror and this device's pin
   * (TokenError `inconsistent_key` if any differs or lacks it), then pinned.
   */
  async consistentKey(day: string): Promise<{ entry: TokenKeyEntry; doc: TokenKeyDocument }> {
    const issuer = await this.keyDocument(`${this.issuerUrl}/v1/token-keys`, "the issuer");
    const entry = issuer.keys.find((k) => k.day === day);
    if (!entry) throw new TokenError("refused", `the issuer lists no token key for ${day}: only ${issuer.keys.map((k) => k.day).join(", ")}`);
    const spki = unb64(entry.public_key);
    if (hex(sha256(spki)) !== entry.token_key_id) throw new TokenError("inconsistent_key", `the issuer's key of ${day} does not match its own token_key_id`);
    const sources: [string, string][] = [[`${this.options.collectorUrl.replace(/\/+$/, "")}/v1/token-keys`, "the collector"], ...(this.options.mirrors ?? []).map((m): [string, string] => [m, `the token-key mirror ${m}`])];
    for (const [url, what] of sources) {
      const doc = await this.keyDocument(url, what);
      const theirs = doc.keys.filter((k) => k.day === day);
      if (theirs.length !== 1 || theirs[0]?.token_key_id !== entry.token_key_id || hex(unb64(theirs[0].public_key)) !== hex(spki)) {
        throw new TokenError(
          "inconsistent_key",
          `${what} does not list the issuer's token key ${entry.token_key_id.slice(0, 16)}… for ${day}: the issuer may be serving this device a key of its own (which would let it recognize this device's tokens), so no token is requested. Check that the collector and the issuer share the same key folder (--token-keys)`,
        );
      }
    }
    const pinned = await this.pins?.pinned(day);
    if (pinned && (pinned.tokenKeyId !== entry.token_key_id || hex(unb64(pinned.publicKey)) !== hex(spki))) {
      throw new TokenError("inconsistent_key", `the token key of ${day} changed from the one this device pinned (${pinned.tokenKeyId.slice(0, 16)}…): refused, no token is requested under it`);
    }
    if (!pinned) await this.pins?.pin(day, { tokenKeyId: entry.token_key_id, publicKey: entry.public_key });
    return { entry, doc: issuer };
  }

  /** Up to `n` finalized tokens of `day` (YYYY-MM-DD): fewer when the device's K of that day run out. */
  async fetchTokens(n: number, day: string): Promise<Uint8Array[]> {
    const { entry, doc } = await this.consistentKey(day);
    const spki = unb64(entry.public_key);
    const key = await importTokenKey(spki);
    if (!/^[0-9a-f]{64}$/.test(entry.token_key_id)) throw new TokenError("malformed", "a token_key_id is 64 lowercase hex digits");
    const keyId = fromHex(entry.token_key_id);
    const digest = challengeDigest(doc.issuer_name, day, this.options.origin);
    const want = Math.max(1, Math.min(n, doc.tokens_per_day ?? n));
    const pending: { input: Uint8Array; inv: Uint8Array }[] = [];
    const requests: string[] = [];
    for (let i = 0; i < want; i++) {
      const nonce = crypto.getRandomValues(new Uint8Array(NONCE_LEN));
      const input = tokenInput(nonce, digest, keyId);
      const { blindedMsg, inv } = await SUITE.blind(key, input);
      pending.push({ input, inv });
      requests.push(b64url(concat(Uint8Array.of(TOKEN_TYPE >> 8, TOKEN_TYPE & 0xff, keyId[31] as number), blindedMsg)));
    }
    const body = utf8(JSON.stringify({ day, requests }));
    const path = "/v1/token-requests";
    const headers = { "Content-Type": "application/json", ...this.options.identity.signRequest("POST", path, body, this.clock() / 1000) };
    const got = (await this.call(this.issuerUrl + path, { method: "POST", body: body as BodyInit, headers }, "the issuer")) as { blind_sigs?: unknown };
    if (!Array.isArray(got.blind_sigs)) throw new TokenError("refused", "the issuer's answer has no blind_sigs");
    const out: Uint8Array[] = [];
    for (let i = 0; i < Math.min(got.blind_sigs.length, pending.length); i++) {
      const p = pending[i] as { input: Uint8Array; inv: Uint8Array };
      let sig: Uint8Array;
      try {
        sig = await SUITE.finalize(key, p.input, unb64(String(got.blind_sigs[i])), p.inv);
      } catch {
        throw new TokenError("refused", "the issuer's blind signature does not verify under its published key: refused (an issuer signing with another key could recognize the token)");
      }
      out.push(concat(p.input, sig));
    }
    return out;
  }
}
