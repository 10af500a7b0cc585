/**
 * The web SDK's durable stock of anonymous upload tokens (docs/TOKENS.md, "The SDK side"), as
 * client_sdk/upload/token_wallet.py: rows of the IndexedDB store `tokens`, each `(token, day, batchId)`.
 *
 * - **A token pays for the metric-day of its key.** A batch of day D takes a token of D only; `tokenFor`
 *   binds a free one to the batch id and returns the same token on every retry of that batch (the collector
 *   answers a retry as a duplicate instead of a second spend). `settle` deletes it once the batch is
 *   delivered; `discard` deletes a token the collector refused (the batch then takes another).
 * - **Grace.** The issuer signs D's tokens and the collector takes them while D is today or yesterday (UTC):
 *   a batch of yesterday is still paid, with a token of yesterday fetched on demand. Rows older than yesterday
 *   are deleted (`tokens_expired`); a batch older than yesterday can no longer be paid (`payable` is false).
 * - **Key consistency.** Each day's key is pinned in the `meta` store (`token_key:<day>`) the first time it
 *   passes the check against the collector's `GET /v1/token-keys` and the mirrors (src/tokens.ts).
 * - **Refill** asks for `stock - held` tokens of the day when fewer than `lowWater` are free; a failure (issuer
 *   down, 429 `token_limit`, an inconsistent key) sets `nextFetch` (backoff, or the issuer's Retry-After), and
 *   the client keeps its batches until then instead of uploading without a token.
 *
 * Everything runs on the upload path (under the origin's upload lock), never in `record()`.
 */
import { sha256 } from "@noble/hashes/sha2.js";
import { hex } from "./mechanisms/base.js";
import { req, transaction, type TokenRow } from "./store.js";
import { IssuerClient, TokenError, authorizationHeader, isoDay, type KeyPin, type KeyPinStore } from "./tokens.js";
import { utcDay } from "./metrics.js";

export interface WalletOptions {
  stock: number;
  lowWater?: number;
  clock: () => number;
  /** Wait (ms) after `failures` consecutive failed refills, or after the issuer's Retry-After (s). */
  backoff: (failures: number, retryAfterS: number | null) => number;
  count: (name: string, n?: number) => void;
}

class IdbKeyPins implements KeyPinStore {
  constructor(private readonly db: () => IDBDatabase) {}
  pinned(day: string): Promise<KeyPin | undefined> {
    return transaction(this.db(), ["meta"], "readonly", async (tx) => (await req(tx.objectStore("meta").get(`token_key:${day}`))) as KeyPin | undefined);
  }
  async pin(day: string, key: KeyPin): Promise<void> {
    await transaction(this.db(), ["meta"], "readwrite", async (tx) => {
      const meta = tx.objectStore("meta");
      if ((await req(meta.get(`token_key:${day}`))) === undefined) await req(meta.put(key, `token_key:${day}`));
    });
  }
}

export class TokenWallet {
  readonly stock: number;
  readonly lowWater: number;
  /** No issuer request before this time (ms): backoff after a failure, or the issuer's Retry-After. */
  nextFetch = 0;
  /** What the last failed refill said (readable; null after a success). */
  lastError: TokenError | null = null;
  private failures = 0;

  constructor(
    private readonly db: () => IDBDatabase,
    readonly issuer: IssuerClient,
    private readonly options: WalletOptions,
  ) {
    if (!Number.isInteger(options.stock) || options.stock < 1) throw new TokenError("malformed", `the token stock must be an integer of at least 1, got ${options.stock}`);
    this.stock = options.stock;
    this.lowWater = Math.max(1, Math.min(this.stock, options.lowWater ?? Math.max(1, Math.floor(this.stock / 4))));
    issuer.pins ??= new IdbKeyPins(db);
  }

  private today(): number {
    return utcDay(this.options.clock());
  }

  /** Whether a batch of `day` can still be paid: its day is today or yesterday. */
  payable(day: number): boolean {
    const t = this.today();
    return day === t || day === t - 1;
  }

  private async expireIn(store: IDBObjectStore, rows: TokenRow[]): Promise<TokenRow[]> {
    const oldest = this.today() - 1;
    let n = 0;
    for (const r of rows) {
      if (r.day < oldest) {
        await req(store.delete(r.id));
        n++;
      }
    }
    if (n) this.options.count("tokens_expired", n);
    return rows.filter((r) => r.day >= oldest);
  }

  /** Free tokens of `day` (default today). */
  async available(day = this.today()): Promise<number> {
    const rows = await transaction(this.db(), ["tokens"], "readonly", async (tx) => (await req(tx.objectStore("tokens").getAll())) as TokenRow[]);
    return rows.filter((r) => r.day === day && r.batchId === null).length;
  }

  /**
   * Fetch tokens of `day` (today, or yesterday for a late batch) if its free stock is below the low-water
   * mark (or `force`) and no backoff holds. True if the wallet then has a free token of that day.
   */
  async refill(day = this.today(), force = false): Promise<boolean> {
    if (!this.payable(day)) return false;
    const rows = await transaction(this.db(), ["tokens"], "readwrite", async (tx) => this.expireIn(tx.objectStore("tokens"), (await req(tx.objectStore("tokens").getAll())) as TokenRow[]));
    const ofDay = rows.filter((r) => r.day === day);
    const free = ofDay.filter((r) => r.batchId === null).length;
    const now = this.options.clock();
    if ((free >= this.lowWater && !force) || now < this.nextFetch) return free > 0;
    const want = day === this.today() ? Math.max(1, this.stock - ofDay.length) : this.lowWater;
    let got: Uint8Array[];
    try {
      got = await this.issuer.fetchTokens(want, isoDay(day));
    } catch (e) {
      const err = e instanceof TokenError ? e : new TokenError("refused", `token refill failed: ${(e as Error).message}`);
      this.failures++;
      this.options.count("token_fetch_failed");
      if (err.reason === "inconsistent_key") {
        this.options.count("token_key_inconsistent");
        console.warn(`ldp-telemetry: ${err.message}`);
      }
      this.lastError = err;
      this.nextFetch = this.options.clock() + this.options.backoff(this.failures, err.reason === "limit" ? err.retryAfter : null);
      return free > 0;
    }
    this.failures = 0;
    this.nextFetch = 0;
    this.lastError = null;
    await transaction(this.db(), ["tokens"], "readwrite", async (tx) => {
      const store = tx.objectStore("tokens");
      for (const t of got) await req(store.put({ id: hex(sha256(t)), token: t, day, batchId: null, fetched: now } satisfies TokenRow));
    });
    this.options.count("tokens_fetched", got.length);
    return free + got.length > 0;
  }

  /**
   * The `Authorization` header for batch `batchId` of day `day`: its token if it has one, else a free one of
   * that day bound to it now; null when there is none (the caller refills or waits).
   */
  async tokenFor(batchId: string, day: number): Promise<string | null> {
    const token = await transaction(this.db(), ["tokens"], "readwrite", async (tx): Promise<Uint8Array | null> => {
      const store = tx.objectStore("tokens");
      const rows = await this.expireIn(store, (await req(store.getAll())) as TokenRow[]);
      let mine = rows.find((r) => r.batchId === batchId);
      if (mine && mine.day !== day) {
        await req(store.put({ ...mine, batchId: null }));
        mine = undefined;
      }
      if (mine) return mine.token;
      const free = rows.filter((r) => r.day === day && r.batchId === null).sort((a, b) => a.fetched - b.fetched)[0];
      if (!free) return null;
      await req(store.put({ ...free, batchId }));
      return free.token;
    });
    return token === null ? null : authorizationHeader(token);
  }

  private async deleteBound(batchId: string): Promise<number> {
    return transaction(this.db(), ["tokens"], "readwrite", async (tx) => {
      const store = tx.objectStore("tokens");
      let n = 0;
      for (const r of (await req(store.getAll())) as TokenRow[]) {
        if (r.batchId === batchId) {
          await req(store.delete(r.id));
          n++;
        }
      }
      return n;
    });
  }

  /** The batch was delivered (or dropped): its token is spent. */
  async settle(batchId: string): Promise<void> {
    await this.deleteBound(batchId);
  }

  /** The collector refused the batch's token (401 `token_*`, 409 `token_spent`): drop it, so the batch's retry takes another. */
  async discard(batchId: string): Promise<void> {
    const n = await this.deleteBound(batchId);
    if (n) this.options.count("tokens_refused", n);
  }
}
