/**
 * TelemetryClient: the web SDK's app-facing object, mirroring client_sdk/client.py.
 *
 * `record(metric, value)` never throws into the app: an unknown metric, a bad value, an expired
 * metric or a full queue is counted (`errors()`), and the value is queued in memory only. The
 * queue is persisted soon after, in one IndexedDB transaction per drain that
 *
 * 1. raises the clock's high-water mark and takes the day from it (the Python ledger's rule: a
 *    clock set back lands on the latest day seen, whose spending is on record, never on a day
 *    whose budget was already counted as past);
 * 2. pins a RAPPOR metric's definition on its first report and drops reports of a later,
 *    different definition (a fresh permanent response per definition would undo memoization);
 * 3. checks each report against the metric's daily report limit r and the local policy's daily ε
 *    caps, and records the spend;
 * 4. privatizes the reports that fit (the true value never reaches storage) and appends them to
 *    the outbox, dropping the oldest reports (counted `outbox_dropped`) beyond the count and byte
 *    quotas.
 *
 * Uploads (`flush()`, a timer, and the page's `visibilitychange`/`pagehide`) form batches of up to
 * `batchSize` reports of one (metric, spec, day), persisting each batch's random id and frame
 * *before* the first attempt, so every retry sends identical bytes under the identical id and the
 * collector counts the batch once. 2xx and 409 delete the batch; any other 4xx but 408 and 429
 * drops it (counted); 408, 429, 5xx and network errors retry after full-jitter exponential
 * backoff, at least what a `Retry-After` asks. On `pagehide` formed batches go by
 * `navigator.sendBeacon` (falling back to `fetch` with `keepalive`) and stay stored until a later
 * upload is answered: the batch id makes the resend harmless.
 *
 * Nothing is lost silently: `flushResult()` says what a flush sent, what the collector refused (a 4xx
 * other than 408, 429 and the token answers: dropped, counted `upload_rejected_batches`/`_reports`, ε
 * spent) and why reports still wait (`transient`, `no_token`, `tokens_required`, `token_refused`);
 * `flush()` resolves its `ok`. A batch refused for its token (401 `token_*`, 409 `token_spent`) is kept
 * and retried: with the `tokens` option under another token from the wallet (src/wallet.ts), without it
 * until the collector accepts it (said once on the console). Sealed metrics are sealed when their batch
 * is formed (src/sealing.ts, src/seal_pin.ts).
 */
import { ClientConfigError, type LDPError } from "./errors.js";
import { canonicalJson } from "./canonical.js";
import { hex } from "./mechanisms/base.js";
import { RapporSpec } from "./mechanisms/rappor.js";
import { specFromDict, type ReportSpec as MechanismSpec } from "./mechanisms/index.js";
import { fetchMetrics, parseMetrics, utcDay, type MetricDefinition, type MetricSet } from "./metrics.js";
import type { LocalPolicy } from "./policy.js";
import { toUnits, EPSILON_UNIT } from "./policy.js";
import { CryptoSource, type RandomSource } from "./random.js";
import { openDatabase, req, transaction, type BatchRow, type LedgerDay, type OutboxRow } from "./store.js";
import { FRAME_CONTENT_TYPE, encodeFrame, makeBatch } from "./wire.js";
import { encodeReport } from "./record.js";
import { NumberRange, type DomainInput } from "./valuedomains.js";
import { SealPin } from "./seal_pin.js";
import { encodeSealedFrame, sealRecords, type AnalyzerPublicKey } from "./sealing.js";
import { DeviceIdentity, IssuerClient, isoDay } from "./tokens.js";
import { TokenWallet } from "./wallet.js";

export const ERROR_TALLIES = [
  "unknown_metric",
  "bad_value",
  "expired_metric",
  "queue_full",
  "closed",
  "internal_error",
  "storage_error",
  "metric_refused",
  "unsealing_refused",
  "pin_conflict",
  "metrics_fetch_failed",
  "upload_failures",
  "outbox_dropped",
  "outbox_unsendable",
  "upload_rejected_batches",
  "upload_rejected_reports",
  "upload_tokens_required",
  "analyzer_key_refused",
  "seal_failed",
  "token_fetch_failed",
  "token_key_inconsistent",
  "tokens_exhausted",
  "tokens_refused",
  "tokens_expired",
] as const;
export const STAT_TALLIES = ["recorded", "clamped", "sampled_out", "over_budget", "uploaded_batches", "uploaded_reports", "beacon_batches", "tokens_fetched"] as const;
const PERSISTED = ["outbox_dropped", "outbox_unsendable", "upload_rejected_batches", "upload_rejected_reports", "uploaded_batches", "uploaded_reports"];

/** What the client needs of the Web Locks API (`navigator.locks`). */
export interface LockManagerLike {
  request<T>(name: string, callback: () => Promise<T>): Promise<T>;
}

/** In-process exclusive locks by name: the fallback where `navigator.locks` is missing (Node 20). */
export class LocalLocks implements LockManagerLike {
  private readonly tails = new Map<string, Promise<unknown>>();
  request<T>(name: string, callback: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(name) ?? Promise.resolve();
    const run = prev.then(callback, callback);
    this.tails.set(
      name,
      run.catch(() => undefined),
    );
    return run;
  }
}

const SHARED_LOCAL_LOCKS = new LocalLocks();

function defaultLocks(): LockManagerLike {
  const nav = (globalThis as { navigator?: { locks?: { request: (name: string, cb: () => Promise<unknown>) => Promise<unknown> } } }).navigator;
  const locks = nav?.locks;
  if (locks && typeof locks.request === "function") {
    return { request: <T>(name: string, cb: () => Promise<T>) => locks.request(name, cb) as Promise<T> };
  }
  return SHARED_LOCAL_LOCKS;
}

export interface ClientOptions {
  /** http(s) URL of the collector (`POST {url}/v1/reports`). */
  collectorUrl: string;
  /** The metrics document (text or parsed) or a parsed MetricSet. */
  metrics: string | MetricSet | Record<string, unknown>;
  policy: LocalPolicy;
  /** Default: `globalThis.indexedDB`. */
  indexedDB?: IDBFactory;
  /** The IndexedDB database name (one per app and collector). */
  storageName?: string;
  fetch?: typeof fetch;
  locks?: LockManagerLike;
  /** Only with `simulation: true`: a seeded source instead of the CSPRNG. */
  random?: RandomSource & { bytes?(n: number): Uint8Array };
  simulation?: boolean;
  /** Milliseconds since the epoch. */
  clock?: () => number;
  batchSize?: number;
  maxAgeMs?: number;
  maxOutboxReports?: number;
  maxOutboxBytes?: number;
  maxQueue?: number;
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  /** Try uploads every this many ms (0: only on flush and page lifecycle events). */
  uploadIntervalMs?: number;
  /** Listen to `visibilitychange`/`pagehide` (default: when a `document`/`window` exists). */
  lifecycle?: boolean;
  /** Default: `navigator.sendBeacon`. */
  sendBeacon?: (url: string, data: Blob) => boolean;
  /** Anonymous upload tokens, for a collector run with `--require-tokens` (docs/TOKENS.md, "The web SDK"). */
  tokens?: TokenOptions;
}

/** Where and as whom the client gets its anonymous upload tokens. */
export interface TokenOptions {
  /** The issuer's URL (`ldp issuer serve`; https, or http to a loopback address). */
  issuerUrl: string;
  /** The device bundle `ldp issuer enroll` wrote (its JSON text or parsed), or a DeviceIdentity. */
  device: DeviceIdentity | string | Record<string, unknown>;
  /** The collector's name its tokens are bound to (`ldp collector --token-origin`). */
  origin: string;
  /** Tokens kept in stock per day (default 16; refilled below a quarter of it). */
  stock?: number;
  /** Further URLs serving the token-key document (e.g. a third party's copy): each must list the same key. */
  mirrors?: readonly string[];
}

/** Why reports are still waiting after an upload attempt (they are kept and retried). */
export interface UploadWait {
  /**
   * `transient`: the collector could not be reached or answered 408/429/5xx; `no_token`: no token for the
   * batch's day and the issuer gave none (unreachable, its K for the day issued, or an inconsistent key);
   * `tokens_required`: the collector requires tokens and this client has no `tokens` option;
   * `token_refused`: the collector refused the batch's token (it takes another on the retry).
   */
  reason: "transient" | "no_token" | "tokens_required" | "token_refused";
  /** What happened and what to do, in words. */
  message: string;
  /** When the next attempt is due (ms since the epoch). */
  retryAt: number;
}

/** What one {@link TelemetryClient.flushResult} did. */
export interface FlushResult {
  /** True when every stored report reached the collector and none was refused during this flush. */
  ok: boolean;
  /** Delivered during this flush (2xx, or a duplicate of a batch delivered before). */
  sent: { batches: number; reports: number };
  /** Refused by the collector during this flush and dropped (their ε stays spent): see `rejection`. */
  refused: { batches: number; reports: number };
  /** Reports still stored (in the outbox or in formed batches), to be sent later. */
  queued: number;
  /** Why reports are still waiting, or null. */
  waiting: UploadWait | null;
  /** The collector's answer to the last batch it refused during this flush, or null. */
  rejection: UploadRejection | null;
}

export interface MetricBudget {
  spent: number;
  cap: number;
  remaining: number;
  reports: number;
}

export interface DayBudget {
  day: number;
  spent: number;
  cap: number;
  remaining: number;
  metrics: Record<string, MetricBudget>;
}

export type UploadResult = "idle" | "delivered" | "rejected" | "retry";

/** The collector's answer to the last batch it refused (and the SDK dropped). */
export interface UploadRejection {
  status: number;
  /** The error body's `error` (e.g. `token_missing`), or null when the body had none. */
  error: string | null;
  message: string;
  /** Reports in the dropped batch. */
  reports: number;
}

/** What the SDK says when a collector asks for anonymous upload tokens and the client has none configured (docs/TOKENS.md). */
export const TOKENS_REQUIRED_MESSAGE =
  "the collector requires anonymous upload tokens (--require-tokens) and this client has no token issuer: " +
  "pass the `tokens` option (issuerUrl, the device bundle from `ldp issuer enroll`, and the collector's --token-origin). " +
  "The reports are kept and sent once the client has tokens (until the outbox limits drop the oldest).";

/** A group of outbox reports to seal before its batch is formed (claim, then formSealed). */
interface SealPlan {
  keys: number[];
  records: Uint8Array[];
  metric: string;
  specId: string;
  day: number;
  bytes: number;
  key: AnalyzerPublicKey;
}

interface Pending {
  m: MetricDefinition;
  index: DomainInput;
  now: number;
}

function checkUrl(url: unknown, what = "collectorUrl"): string {
  if (typeof url !== "string") throw new ClientConfigError(`${what} must be a string such as https://collector.example.org`);
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new ClientConfigError(`${what} ${JSON.stringify(url)} is not a URL`);
  }
  if (u.protocol !== "https:" && u.protocol !== "http:") throw new ClientConfigError(`${what} must be http(s), got ${u.protocol}`);
  const loopback = ["127.0.0.1", "localhost", "[::1]"].includes(u.hostname);
  if (u.protocol === "http:" && !loopback) throw new ClientConfigError(`${what} must use https (plain http only to a loopback address), got ${url}`);
  return url.replace(/\/+$/, "");
}

function positiveInt(name: string, v: number | undefined, dflt: number, max: number): number {
  const x = v ?? dflt;
  if (!Number.isInteger(x) || x < 1 || x > max) throw new ClientConfigError(`${name} must be an integer from 1 to ${max}, got ${x}`);
  return x;
}

/** Seconds from a Retry-After value (delta-seconds or an HTTP date), or null. */
export function parseRetryAfter(value: string | null, nowMs: number): number | null {
  if (value === null) return null;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v);
  const t = Date.parse(v);
  if (Number.isNaN(t) || !/GMT|UTC|[+-]\d{4}$/.test(v)) return null;
  return Math.max(0, (t - nowMs) / 1000);
}

export class TelemetryClient {
  readonly collectorUrl: string;
  readonly reportsUrl: string;
  readonly policy: LocalPolicy;
  /** Resolves once the database is open (record() queues before that). */
  readonly ready: Promise<void>;
  private readonly metricDefs = new Map<string, MetricDefinition>();
  private readonly refused = new Map<string, string>();
  /** The bundled document's analyzer keys and sealed metrics, held against served definitions. */
  private readonly sealPin: SealPin;
  private readonly refusedServed = new Set<string>();
  private readonly tally: Record<string, number> = {};
  private readonly queue: Pending[] = [];
  private readonly rng: RandomSource & { bytes?(n: number): Uint8Array };
  private readonly clock: () => number;
  private readonly fetchImpl: typeof fetch;
  private readonly locks: LockManagerLike;
  private readonly storageName: string;
  private readonly factory: IDBFactory;
  private readonly batchSize: number;
  private readonly maxAgeMs: number;
  private readonly maxOutboxReports: number;
  private readonly maxOutboxBytes: number;
  private readonly maxQueue: number;
  private readonly backoffBaseMs: number;
  private readonly backoffMaxMs: number;
  private readonly sendBeacon: ((url: string, data: Blob) => boolean) | null;
  private db: IDBDatabase | null = null;
  private deviceSecret: Uint8Array | null = null;
  private closed = false;
  private persisting: Promise<void> | null = null;
  private failures = 0;
  private blockedUntil = 0;
  private floorDay = 0;
  private timer: ReturnType<typeof setInterval> | null = null;
  private readonly unlisten: (() => void)[] = [];
  /** formed batches not yet acknowledged, for the page-hide beacon */
  private readonly formed = new Map<string, BatchRow>();
  private readonly metricKeys = new Map<string, Uint8Array>();
  private rejection: UploadRejection | null = null;
  private toldTokens = false;
  private readonly wallet: TokenWallet | null = null;
  private waiting: UploadWait | null = null;

  constructor(options: ClientOptions) {
    for (const name of [...ERROR_TALLIES, ...STAT_TALLIES]) this.tally[name] = 0;
    this.collectorUrl = checkUrl(options.collectorUrl);
    this.reportsUrl = this.collectorUrl + "/v1/reports";
    if (!options.policy || typeof (options.policy as LocalPolicy).checkMetric !== "function") throw new ClientConfigError("policy must be a LocalPolicy");
    this.policy = options.policy;
    if (options.random && !options.simulation) {
      throw new ClientConfigError("a seeded random source is for simulations only: pass simulation: true, or leave random out to use crypto.getRandomValues");
    }
    if (options.simulation && !options.random) throw new ClientConfigError("simulation mode needs a random source (new SimulationSource(seed))");
    this.rng = options.random ?? new CryptoSource();
    this.clock = options.clock ?? (() => Date.now());
    const f = options.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new ClientConfigError("no fetch: pass options.fetch");
    this.fetchImpl = f.bind(globalThis) as typeof fetch;
    this.locks = options.locks ?? defaultLocks();
    const factory = options.indexedDB ?? (globalThis as { indexedDB?: IDBFactory }).indexedDB;
    if (!factory) throw new ClientConfigError("IndexedDB is not available: pass options.indexedDB (e.g. fake-indexeddb in Node)");
    this.factory = factory;
    this.storageName = options.storageName ?? "ldp-telemetry";
    this.batchSize = positiveInt("batchSize", options.batchSize, 500, 1 << 20);
    this.maxAgeMs = options.maxAgeMs ?? 3_600_000;
    this.maxOutboxReports = positiveInt("maxOutboxReports", options.maxOutboxReports, 10_000, 1 << 24);
    this.maxOutboxBytes = positiveInt("maxOutboxBytes", options.maxOutboxBytes, 5 * 1024 * 1024, 2 ** 31);
    this.maxQueue = positiveInt("maxQueue", options.maxQueue, 10_000, 1 << 24);
    this.backoffBaseMs = options.backoffBaseMs ?? 1000;
    this.backoffMaxMs = options.backoffMaxMs ?? 3_600_000;
    if (!(this.backoffBaseMs > 0 && this.backoffMaxMs >= this.backoffBaseMs)) throw new ClientConfigError("backoff needs backoffBaseMs > 0 and backoffMaxMs >= backoffBaseMs");
    const nav = (globalThis as { navigator?: { sendBeacon?: (url: string, data: Blob) => boolean } }).navigator;
    this.sendBeacon = options.sendBeacon ?? (nav?.sendBeacon ? nav.sendBeacon.bind(nav) : null);

    let set: MetricSet;
    try {
      set = typeof options.metrics === "object" && "metrics" in options.metrics && options.metrics.metrics instanceof Map ? (options.metrics as MetricSet) : parseMetrics(options.metrics, { rejectExpired: false });
    } catch (e) {
      throw new ClientConfigError(`metrics: ${(e as LDPError).message}`);
    }
    for (const [name, m] of set.metrics) {
      try {
        this.policy.checkMetric(m);
        this.metricDefs.set(name, m);
      } catch (e) {
        this.refused.set(name, (e as Error).message);
        this.tally.metric_refused = (this.tally.metric_refused ?? 0) + 1;
      }
    }
    for (const [name, why] of set.unsupported) this.refused.set(name, why);
    this.sealPin = new SealPin(set, (n) => this.count(n));
    if (options.tokens) this.wallet = this.makeWallet(options.tokens);

    this.ready = this.open();
    this.ready.catch(() => undefined);
    const interval = options.uploadIntervalMs ?? 60_000;
    if (interval > 0) {
      this.timer = setInterval(() => void this.upload(false).catch(() => undefined), interval);
      (this.timer as { unref?: () => void }).unref?.();
    }
    const g = globalThis as { document?: Document; addEventListener?: typeof addEventListener; removeEventListener?: typeof removeEventListener };
    if (options.lifecycle ?? (g.document !== undefined && typeof g.addEventListener === "function")) this.listen();
  }

  private makeWallet(t: TokenOptions): TokenWallet {
    if (!t || typeof t !== "object") throw new ClientConfigError("tokens must be {issuerUrl, device, origin}");
    const issuerUrl = checkUrl(t.issuerUrl, "tokens.issuerUrl");
    if (typeof t.origin !== "string" || !t.origin) throw new ClientConfigError("tokens.origin must be the collector's --token-origin name (e.g. \"ldp-collector\")");
    const mirrors = (t.mirrors ?? []).map((m, i) => checkUrl(m, `tokens.mirrors[${i}]`));
    let device: DeviceIdentity;
    try {
      device = t.device instanceof DeviceIdentity ? t.device : DeviceIdentity.fromBundle(t.device);
    } catch (e) {
      throw new ClientConfigError(`tokens.device: ${(e as Error).message}`);
    }
    const issuer = new IssuerClient({ issuerUrl, identity: device, origin: t.origin, collectorUrl: this.collectorUrl, mirrors, fetch: this.fetchImpl, clock: this.clock });
    try {
      return new TokenWallet(() => this.db as IDBDatabase, issuer, {
        stock: t.stock ?? 16,
        clock: this.clock,
        backoff: (failures, retryAfterS) => this.backoffDelay(failures, retryAfterS),
        count: (name, n) => this.count(name, n),
      });
    } catch (e) {
      throw new ClientConfigError(`tokens: ${(e as Error).message}`);
    }
  }

  /** Construct and wait until the database is open. */
  static async open(options: ClientOptions): Promise<TelemetryClient> {
    const c = new TelemetryClient(options);
    await c.ready;
    return c;
  }

  private async open(): Promise<void> {
    try {
      const db = await openDatabase(this.factory, this.storageName);
      this.db = db;
      const fresh = this.randomBytes(32);
      await transaction(db, ["meta", "batches"], "readwrite", async (tx) => {
        const meta = tx.objectStore("meta");
        const secret = (await req(meta.get("device_secret"))) as Uint8Array | undefined;
        if (secret instanceof Uint8Array && secret.length === 32) this.deviceSecret = secret;
        else {
          await req(meta.put(fresh, "device_secret"));
          this.deviceSecret = fresh;
        }
        const high = (await req(meta.get("high_water"))) as number | undefined;
        if (typeof high === "number") this.floorDay = utcDay(high);
        for (const name of PERSISTED) {
          const v = (await req(meta.get(`tally:${name}`))) as number | undefined;
          if (typeof v === "number") this.tally[name] = v;
        }
        for (const b of (await req(tx.objectStore("batches").getAll())) as BatchRow[]) this.formed.set(b.id, b);
      });
    } catch (e) {
      this.count("storage_error");
      throw e;
    }
    if (this.queue.length) this.schedulePersist();
  }

  private randomBytes(n: number): Uint8Array {
    if (this.rng.bytes) return this.rng.bytes(n);
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = this.rng.below(256);
    return out;
  }

  private count(name: string, n = 1): void {
    this.tally[name] = (this.tally[name] ?? 0) + n;
  }

  // ------------------------------------------------------------------ hot path
  /** Privately report that `metric` took `value`. Never throws; never waits on I/O. */
  record(metric: string, value: unknown): void {
    try {
      if (this.closed) return this.count("closed");
      const m = typeof metric === "string" ? this.metricDefs.get(metric) : undefined;
      if (!m) return this.count("unknown_metric");
      let index: DomainInput;
      try {
        if (m.domain instanceof NumberRange) {
          const [x, clamped] = m.domain.prepare(value);
          if (clamped) this.count("clamped");
          index = x;
        } else index = m.domain.indexOf(value as string | number | bigint);
      } catch {
        return this.count("bad_value");
      }
      const now = this.clock();
      const day = Math.max(utcDay(now), this.floorDay);
      if (day > m.expiresDay) return this.count("expired_metric");
      if (this.queue.length >= this.maxQueue) return this.count("queue_full");
      this.queue.push({ m, index, now });
      this.schedulePersist();
    } catch {
      try {
        this.count("internal_error");
      } catch {
        /* never into the app */
      }
    }
  }

  private schedulePersist(): void {
    if (this.persisting || !this.db) return;
    this.persisting = Promise.resolve()
      .then(() => this.drain())
      .finally(() => {
        this.persisting = null;
        if (this.queue.length && this.db) this.schedulePersist();
      });
  }

  /** Persist everything queued (exposed for flush and tests). */
  private async drain(): Promise<void> {
    while (this.queue.length && this.db) {
      const items = this.queue.splice(0, 2048);
      await this.locks.request(`ldp-telemetry:${this.storageName}:ledger`, () => this.persist(items));
    }
  }

  private metricKey(m: MetricDefinition): Uint8Array {
    const k = `${m.name}\u0000${m.spec.memoDerivationId}`;
    let key = this.metricKeys.get(k);
    if (!key) {
      key = RapporSpec.metricSecret(this.deviceSecret as Uint8Array, m.name, m.spec.memoDerivationId);
      this.metricKeys.set(k, key);
    }
    return key;
  }

  private encode(m: MetricDefinition, index: DomainInput): Uint8Array {
    return encodeReport(m.spec, index, { rng: this.rng, deviceSecret: this.deviceSecret as Uint8Array, metricKey: () => this.metricKey(m) });
  }

  private async persist(items: Pending[]): Promise<void> {
    const db = this.db as IDBDatabase;
    const counts = { recorded: 0, sampled_out: 0, over_budget: 0, pin_conflict: 0, outbox_dropped: 0 };
    let dayUsed = 0;
    try {
      await transaction(db, ["meta", "ledger", "outbox", "batches"], "readwrite", async (tx) => {
        const meta = tx.objectStore("meta");
        const ledger = tx.objectStore("ledger");
        const outbox = tx.objectStore("outbox");
        counts.recorded = counts.sampled_out = counts.over_budget = counts.pin_conflict = counts.outbox_dropped = 0;
        const now = Math.max(...items.map((i) => i.now));
        const stored = (await req(meta.get("high_water"))) as number | undefined;
        const high = typeof stored === "number" && stored > now ? stored : now;
        if (high !== stored) await req(meta.put(high, "high_water"));
        const day = utcDay(high);
        dayUsed = day;
        // pins of memoized (RAPPOR, LOLOHA, 1bitmean, dbitflip) metrics: set on the first report, never changed
        const pins = new Map<string, string>();
        const kept: Pending[] = [];
        for (const it of items) {
          if (!it.m.spec.memoized) {
            kept.push(it);
            continue;
          }
          const want = canonicalJson({ domain: it.m.domain.toDict(), mechanism: it.m.spec.toDict() });
          let pin = pins.get(it.m.name);
          if (pin === undefined) {
            pin = (await req(meta.get(`pin:${it.m.name}`))) as string | undefined;
            if (pin === undefined) {
              await req(meta.put(want, `pin:${it.m.name}`));
              pin = want;
            }
            pins.set(it.m.name, pin);
          }
          if (pin === want) kept.push(it);
          else counts.pin_conflict++;
        }
        const stored_ = (await req(ledger.get(day))) as LedgerDay | undefined;
        const book: LedgerDay = stored_ ?? { day, metrics: {} };
        let total = Object.values(book.metrics).reduce((a, r) => a + r.spent, 0);
        let touched = false;
        let added = 0;
        let addedBytes = 0;
        for (const it of kept) {
          const name = it.m.name;
          const row = (book.metrics[name] ??= { spent: 0, reports: 0 });
          const units = toUnits(it.m.spec.epsilon, true);
          if (row.reports >= it.m.maxReportsPerDay) counts.sampled_out++;
          else if (row.spent + units > this.policy.metricCapUnits(name) || total + units > this.policy.totalCapUnits) counts.over_budget++;
          else {
            row.spent += units;
            row.reports += 1;
            total += units;
            touched = true;
            const record = this.encode(it.m, it.index);
            const out: OutboxRow = { metric: name, specId: it.m.spec.specId, spec: it.m.spec.toDict(), day, record, enqueued: it.now };
            await req(outbox.add(out));
            added++;
            addedBytes += record.length;
            counts.recorded++;
          }
        }
        if (touched) await req(ledger.put(book));
        counts.outbox_dropped = await this.enforceQuotas(tx, added, addedBytes);
        if (counts.outbox_dropped) {
          const prev = ((await req(meta.get("tally:outbox_dropped"))) as number | undefined) ?? 0;
          await req(meta.put(prev + counts.outbox_dropped, "tally:outbox_dropped"));
        }
      });
    } catch (e) {
      this.count(e instanceof TypeError || e instanceof ReferenceError || e instanceof RangeError ? "internal_error" : "storage_error", items.length);
      return;
    }
    this.floorDay = Math.max(this.floorDay, dayUsed);
    for (const [k, v] of Object.entries(counts)) this.count(k, v);
  }

  /** Keep the outbox within its quotas: drop whole batches first, then the oldest queued reports. */
  private async enforceQuotas(tx: IDBTransaction, added: number, addedBytes: number): Promise<number> {
    const meta = tx.objectStore("meta");
    let n = (((await req(meta.get("outbox_reports"))) as number | undefined) ?? 0) + added;
    let bytes = (((await req(meta.get("outbox_bytes"))) as number | undefined) ?? 0) + addedBytes;
    let dropped = 0;
    if (n > this.maxOutboxReports || bytes > this.maxOutboxBytes) {
      const batches = ((await req(tx.objectStore("batches").getAll())) as BatchRow[]).sort((a, b) => a.created - b.created);
      for (const b of batches) {
        if (n <= this.maxOutboxReports && bytes <= this.maxOutboxBytes) break;
        await req(tx.objectStore("batches").delete(b.id));
        this.formed.delete(b.id);
        n -= b.n;
        bytes -= b.bytes;
        dropped += b.n;
      }
      while (n > this.maxOutboxReports || bytes > this.maxOutboxBytes) {
        const cursor = await req(tx.objectStore("outbox").openCursor());
        if (!cursor) break;
        const row = cursor.value as OutboxRow;
        await req(cursor.delete());
        n -= 1;
        bytes -= row.record.length;
        dropped += 1;
      }
    }
    await req(meta.put(Math.max(0, n), "outbox_reports"));
    await req(meta.put(Math.max(0, bytes), "outbox_bytes"));
    return dropped;
  }

  // ------------------------------------------------------------------ uploads
  private async bumpPersisted(tx: IDBTransaction, name: string, n: number): Promise<void> {
    if (!n) return;
    const meta = tx.objectStore("meta");
    const prev = ((await req(meta.get(`tally:${name}`))) as number | undefined) ?? 0;
    await req(meta.put(prev + n, `tally:${name}`));
  }

  /** A due formed batch, or a new one formed now (in one transaction, before any attempt). */
  private async claim(force: boolean): Promise<BatchRow | null> {
    const db = this.db as IDBDatabase;
    const now = this.clock();
    const batchId = this.randomBytes(16);
    let unsendable = 0;
    let toSeal: SealPlan | null = null;
    const batch = await transaction(db, ["meta", "outbox", "batches"], "readwrite", async (tx): Promise<BatchRow | null> => {
      const batches = (await req(tx.objectStore("batches").getAll())) as BatchRow[];
      const due = batches.filter((b) => b.nextAt <= now).sort((a, b) => a.created - b.created)[0];
      if (due) return due;
      const outbox = tx.objectStore("outbox");
      const keys = (await req(outbox.getAllKeys())) as number[];
      if (!keys.length) return null;
      const rows = (await req(outbox.getAll())) as OutboxRow[];
      const first = rows[0] as OutboxRow;
      const group: [number, OutboxRow][] = [];
      rows.forEach((r, i) => {
        if (group.length < this.batchSize && r.metric === first.metric && r.specId === first.specId && r.day === first.day) group.push([keys[i] as number, r]);
      });
      if (!force && group.length < this.batchSize && now - first.enqueued < this.maxAgeMs) return null;
      let spec: MechanismSpec | null = null;
      try {
        spec = specFromDict(first.spec);
        if (spec.specId !== first.specId) spec = null;
      } catch {
        spec = null;
      }
      const bytes = group.reduce((a, [, r]) => a + r.record.length, 0);
      const sealTo = spec === null ? null : this.sealPin.keyFor(first.metric);
      if (spec !== null && !sealTo && this.sealPin.mustBeSealed(first.metric)) {
        unsendable = -1; // a sealed metric with no key to seal to: never a plain frame (cannot happen with a valid document)
        return null;
      }
      if (sealTo) {
        // Sealing is asynchronous (Web Crypto): seal outside this transaction, then form the batch (formSealed).
        toSeal = { keys: group.map(([k]) => k), records: group.map(([, r]) => r.record), metric: first.metric, specId: first.specId, day: first.day, bytes, key: sealTo };
        return null;
      }
      for (const [k] of group) await req(outbox.delete(k));
      const meta = tx.objectStore("meta");
      if (spec === null) {
        unsendable = group.length;
        await this.bumpPersisted(tx, "outbox_unsendable", group.length);
        const n0 = ((await req(meta.get("outbox_reports"))) as number | undefined) ?? 0;
        const b0 = ((await req(meta.get("outbox_bytes"))) as number | undefined) ?? 0;
        await req(meta.put(Math.max(0, n0 - group.length), "outbox_reports"));
        await req(meta.put(Math.max(0, b0 - bytes), "outbox_bytes"));
        return null;
      }
      const frame = encodeFrame(makeBatch(first.metric, spec, first.day, group.map(([, r]) => r.record), batchId));
      const row: BatchRow = { id: hex(batchId), metric: first.metric, n: group.length, bytes, frame, attempts: 0, nextAt: 0, created: now, day: first.day };
      await req(tx.objectStore("batches").put(row));
      return row;
    });
    if (unsendable < 0) this.count("seal_failed");
    else if (unsendable) this.count("outbox_unsendable", unsendable);
    const formed = batch ?? (toSeal ? await this.formSealed(toSeal, batchId, now) : null);
    if (formed) this.formed.set(formed.id, formed);
    return formed;
  }

  /**
   * Seal a group of outbox reports (each record under its own ephemeral key) and form its batch: one
   * transaction that takes the reports out of the outbox only if every one of them is still there (a
   * quota drop in between leaves them for the next attempt). Never a plain frame of a sealed metric.
   */
  private async formSealed(plan: SealPlan, batchId: Uint8Array, now: number): Promise<BatchRow | null> {
    let frame: Uint8Array;
    try {
      const sealed = await sealRecords(plan.records, plan.metric, plan.specId, plan.day, plan.key);
      frame = encodeSealedFrame(plan.metric, plan.specId, plan.day, sealed, (plan.records[0] as Uint8Array).length, batchId);
    } catch {
      this.count("seal_failed");
      return null;
    }
    return transaction(this.db as IDBDatabase, ["outbox", "batches"], "readwrite", async (tx): Promise<BatchRow | null> => {
      const outbox = tx.objectStore("outbox");
      for (const k of plan.keys) if ((await req(outbox.getKey(k))) === undefined) return null;
      for (const k of plan.keys) await req(outbox.delete(k));
      const row: BatchRow = { id: hex(batchId), metric: plan.metric, n: plan.keys.length, bytes: plan.bytes, frame, attempts: 0, nextAt: 0, created: now, day: plan.day, sealed: true };
      await req(tx.objectStore("batches").put(row));
      return row;
    });
  }

  private async finish(batch: BatchRow, outcome: "delivered" | "rejected"): Promise<void> {
    await transaction(this.db as IDBDatabase, ["meta", "batches"], "readwrite", async (tx) => {
      const exists = await req(tx.objectStore("batches").getKey(batch.id));
      if (exists === undefined) return; // another tab finished it
      await req(tx.objectStore("batches").delete(batch.id));
      const meta = tx.objectStore("meta");
      const n0 = ((await req(meta.get("outbox_reports"))) as number | undefined) ?? 0;
      const b0 = ((await req(meta.get("outbox_bytes"))) as number | undefined) ?? 0;
      await req(meta.put(Math.max(0, n0 - batch.n), "outbox_reports"));
      await req(meta.put(Math.max(0, b0 - batch.bytes), "outbox_bytes"));
      if (outcome === "delivered") {
        await this.bumpPersisted(tx, "uploaded_batches", 1);
        await this.bumpPersisted(tx, "uploaded_reports", batch.n);
      } else {
        await this.bumpPersisted(tx, "upload_rejected_batches", 1);
        await this.bumpPersisted(tx, "upload_rejected_reports", batch.n);
      }
    });
    this.formed.delete(batch.id);
    if (outcome === "delivered") {
      this.count("uploaded_batches");
      this.count("uploaded_reports", batch.n);
    } else {
      this.count("upload_rejected_batches");
      this.count("upload_rejected_reports", batch.n);
    }
  }

  /** The wait (ms) after `failures` consecutive transient failures: full jitter, or Retry-After plus up to 10 %. */
  backoffDelay(failures: number, retryAfterS: number | null): number {
    const u = this.rng.float53();
    if (retryAfterS !== null) return Math.min(retryAfterS * 1000, this.backoffMaxMs) * (1 + 0.1 * u);
    const ceiling = Math.min(this.backoffMaxMs, this.backoffBaseMs * 2 ** Math.min(failures, 62));
    return u * ceiling;
  }

  /** The day a batch pays for: its own (rows of SDK 0.1 have none: read it from the frame). */
  private static batchDay(batch: BatchRow): number {
    if (typeof batch.day === "number") return batch.day;
    return new DataView(batch.frame.buffer, batch.frame.byteOffset, batch.frame.byteLength).getUint32(16, true);
  }

  private async deliver(batch: BatchRow): Promise<UploadResult> {
    let retryAfter: number | null = null;
    const day = TelemetryClient.batchDay(batch);
    let auth: string | null = null;
    if (this.wallet) {
      if (!this.wallet.payable(day)) {
        // Tokens of a day are issued and accepted while it is today or yesterday (docs/TOKENS.md, "Grace").
        this.rejection = {
          status: 0,
          error: "token_expired",
          message: `a batch of ${isoDay(day)} can no longer be paid with a token (tokens of a day are good until the end of the next UTC day): dropped, its ε stays spent`,
          reports: batch.n,
        };
        await this.finish(batch, "rejected");
        return "rejected";
      }
      auth = await this.wallet.tokenFor(batch.id, day);
      if (auth === null) {
        await this.wallet.refill(day, true);
        auth = await this.wallet.tokenFor(batch.id, day);
      }
      if (auth === null) {
        this.count("tokens_exhausted");
        const why = this.wallet.lastError?.message ?? "the issuer gave no token";
        return this.hold(batch, "no_token", `no upload token for ${isoDay(day)}: ${why}. The reports are kept and sent once the issuer gives tokens`, null, this.wallet.nextFetch);
      }
    }
    let status = 0;
    try {
      const headers: Record<string, string> = { "Content-Type": FRAME_CONTENT_TYPE, "Idempotency-Key": batch.id };
      if (auth !== null) headers.Authorization = auth;
      const resp = await this.fetchImpl(this.reportsUrl, {
        method: "POST",
        body: batch.frame as BodyInit,
        headers,
        credentials: "omit",
        keepalive: batch.frame.length < 60_000,
      });
      status = resp.status;
      let text = "";
      try {
        text = await resp.text();
      } catch {
        /* the body only explains a refusal */
      }
      const { error, message } = TelemetryClient.errorBody(text);
      const tokenRefusal = (status === 401 && error !== null && error.startsWith("token_")) || (status === 409 && error === "token_spent");
      if ((status >= 200 && status < 300) || (status === 409 && !tokenRefusal)) {
        this.failures = 0;
        await this.wallet?.settle(batch.id);
        await this.finish(batch, "delivered");
        return "delivered";
      }
      if (tokenRefusal) return await this.tokenRefused(batch, day, status, error as string, message);
      if (status >= 400 && status < 500 && status !== 408 && status !== 429) {
        this.failures = 0;
        this.noteRejection(status, error, message, batch.n);
        await this.wallet?.settle(batch.id);
        await this.finish(batch, "rejected");
        return "rejected";
      }
      if (status === 429 || status === 503) retryAfter = parseRetryAfter(resp.headers.get("Retry-After"), this.clock());
    } catch {
      /* a network error: transient */
    }
    this.count("upload_failures");
    const what = status ? `the collector answered ${status}` : `the collector at ${this.collectorUrl} could not be reached (offline, or it does not allow this page's origin: --allow-origin)`;
    return this.hold(batch, "transient", `${what}; the reports are kept and retried`, retryAfter);
  }

  /** The collector refused the batch's token: the batch is kept (another token, or tokens at all, can pay for it). */
  private async tokenRefused(batch: BatchRow, day: number, status: number, error: string, message: string): Promise<UploadResult> {
    if (!this.wallet) {
      this.count("upload_tokens_required");
      if (!this.toldTokens) {
        this.toldTokens = true;
        console.warn(`ldp-telemetry: ${TOKENS_REQUIRED_MESSAGE} (collector: ${status} ${error}: ${message})`);
      }
      return this.hold(batch, "tokens_required", `${TOKENS_REQUIRED_MESSAGE} (collector: ${status} ${error}: ${message})`, null);
    }
    await this.wallet.discard(batch.id);
    if (!this.wallet.payable(day)) return this.deliver(batch); // drops it, counted, with the reason
    const hint: Record<string, string> = {
      token_wrong_challenge: ": check that tokens.origin is the collector's --token-origin and that the issuer is the one the collector trusts",
      token_unknown_key: ": the collector does not know the issuer's key (does it read the issuer's public key folder, --token-keys?)",
      token_bad_signature: ": the collector does not accept the issuer's signatures (another issuer than the collector's?)",
    };
    return this.hold(batch, "token_refused", `the collector refused the batch's token (${status} ${error}: ${message})${hint[error] ?? ""}; the batch is kept and retried with another token`, null);
  }

  /** Keep `batch` for a later attempt: back off (or wait until `until`), and say why. */
  private async hold(batch: BatchRow, reason: UploadWait["reason"], message: string, retryAfterS: number | null, until = 0): Promise<UploadResult> {
    this.failures++;
    const wait = this.backoffDelay(this.failures, retryAfterS);
    this.blockedUntil = Math.max(this.clock() + wait, until);
    const nextAt = this.blockedUntil;
    this.waiting = { reason, message, retryAt: nextAt };
    await transaction(this.db as IDBDatabase, ["batches"], "readwrite", async (tx) => {
      const row = (await req(tx.objectStore("batches").get(batch.id))) as BatchRow | undefined;
      if (row) await req(tx.objectStore("batches").put({ ...row, attempts: row.attempts + 1, nextAt }));
    });
    return "retry";
  }

  private static errorBody(text: string): { error: string | null; message: string } {
    let error: string | null = null;
    let message = text.slice(0, 500);
    try {
      const body = JSON.parse(text) as { error?: unknown; message?: unknown };
      if (typeof body.error === "string") error = body.error;
      if (typeof body.message === "string") message = body.message;
    } catch {
      /* not JSON: keep the text */
    }
    return { error, message };
  }

  private noteRejection(status: number, error: string | null, message: string, reports: number): void {
    this.rejection = { status, error, message, reports };
  }

  /** The collector's answer to the last batch it refused (its reports were dropped), or null. */
  lastRejection(): UploadRejection | null {
    return this.rejection === null ? null : { ...this.rejection };
  }

  /** Send batches until none is due ("idle"), or a transient failure ("retry"). */
  async upload(force: boolean): Promise<UploadResult> {
    await this.ready;
    if (!this.db) return "idle";
    if (this.clock() < this.blockedUntil) return "retry";
    return this.locks.request(`ldp-telemetry:${this.storageName}:upload`, async () => {
      let last: UploadResult = "idle";
      for (;;) {
        const batch = await this.claim(force);
        if (!batch) return last;
        const r = await this.deliver(batch);
        if (r === "retry") return r;
        last = r;
      }
    });
  }

  /**
   * Persist what record() queued and upload everything now. True if every report reached the collector;
   * false if some are still waiting (a transient failure, no token yet, or a collector that requires tokens
   * this client has not been given: they are kept and retried) or if the collector refused a batch during
   * this flush (its reports were dropped: see `lastRejection()` and the `upload_rejected_*` tallies). It
   * never rejects. {@link flushResult} says what happened.
   */
  async flush(): Promise<boolean> {
    return (await this.flushResult()).ok;
  }

  /** As {@link flush}, resolving with what happened: sent, refused (and why), still queued (and why). Never rejects. */
  async flushResult(): Promise<FlushResult> {
    const before = { sb: this.tally.uploaded_batches ?? 0, sr: this.tally.uploaded_reports ?? 0, rb: this.tally.upload_rejected_batches ?? 0, rr: this.tally.upload_rejected_reports ?? 0 };
    const rejectionBefore = this.rejection;
    let queued = 0;
    let ok = false;
    const waitBefore = this.waiting;
    this.waiting = null;
    try {
      await this.ready;
      while (this.persisting || this.queue.length) {
        if (this.persisting) await this.persisting;
        else if (this.queue.length) await this.drain();
      }
      const r = await this.upload(true);
      if (r === "retry" && this.waiting === null) {
        // still backing off from an earlier attempt: the same reason holds
        const at = this.blockedUntil;
        this.waiting = waitBefore ? { ...waitBefore, retryAt: at } : { reason: "transient", message: `uploads are backing off after a failure until ${new Date(at).toISOString()}; the reports are kept`, retryAt: at };
      }
      queued = await this.pendingReports();
      ok = r !== "retry" && queued === 0;
    } catch {
      this.count("internal_error");
    }
    const refused = { batches: (this.tally.upload_rejected_batches ?? 0) - before.rb, reports: (this.tally.upload_rejected_reports ?? 0) - before.rr };
    return {
      ok: ok && refused.batches === 0,
      sent: { batches: (this.tally.uploaded_batches ?? 0) - before.sb, reports: (this.tally.uploaded_reports ?? 0) - before.sr },
      refused,
      queued,
      waiting: this.waiting === null ? null : { ...(this.waiting as UploadWait) },
      rejection: refused.batches && this.rejection !== rejectionBefore && this.rejection ? { ...this.rejection } : null,
    };
  }

  /** Reports stored and not yet delivered (queued or batched). */
  async pendingReports(): Promise<number> {
    await this.ready;
    return transaction(this.db as IDBDatabase, ["meta"], "readonly", async (tx) => ((await req(tx.objectStore("meta").get("outbox_reports"))) as number | undefined) ?? 0);
  }

  /** Page hidden or going away: beacon the formed batches (they stay stored until an upload is answered), then flush. */
  beaconFlush(): void {
    try {
      // A beacon carries no Authorization header: with tokens, the batches go by flush() (fetch, keepalive) only.
      for (const b of this.wallet ? [] : this.formed.values()) {
        let sent = false;
        if (this.sendBeacon) {
          try {
            sent = this.sendBeacon(this.reportsUrl, new Blob([b.frame as BlobPart], { type: FRAME_CONTENT_TYPE }));
          } catch {
            sent = false;
          }
        }
        if (!sent) {
          void this.fetchImpl(this.reportsUrl, {
            method: "POST",
            body: b.frame as BodyInit,
            headers: { "Content-Type": FRAME_CONTENT_TYPE, "Idempotency-Key": b.id },
            keepalive: true,
            credentials: "omit",
          }).catch(() => undefined);
        }
        this.count("beacon_batches");
      }
      void this.flush();
    } catch {
      this.count("internal_error");
    }
  }

  private listen(): void {
    const g = globalThis as unknown as { document?: Document; addEventListener: typeof addEventListener; removeEventListener: typeof removeEventListener };
    const onVisibility = (): void => {
      if (g.document?.visibilityState === "hidden") void this.flush();
    };
    const onPageHide = (): void => this.beaconFlush();
    g.document?.addEventListener("visibilitychange", onVisibility);
    g.addEventListener("pagehide", onPageHide);
    this.unlisten.push(() => g.document?.removeEventListener("visibilitychange", onVisibility));
    this.unlisten.push(() => g.removeEventListener("pagehide", onPageHide));
  }

  /** Stop recording; persist what is queued, upload it (unless `upload: false`), and close the database. */
  async close(options: { upload?: boolean } = {}): Promise<void> {
    if (this.closed) return;
    if (options.upload ?? true) await this.flush();
    else {
      await this.ready.catch(() => undefined);
      while (this.persisting || this.queue.length) {
        if (this.persisting) await this.persisting;
        else await this.drain();
      }
    }
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    for (const f of this.unlisten) f();
    this.db?.close();
    this.db = null;
  }

  /** ε spent and remaining on `day` (default: the current ledger day, UTC), per metric and in total. */
  async privacySpent(day?: number): Promise<DayBudget> {
    await this.ready;
    const db = this.db as IDBDatabase;
    return transaction(db, ["meta", "ledger"], "readonly", async (tx) => {
      const high = (await req(tx.objectStore("meta").get("high_water"))) as number | undefined;
      const d = day ?? utcDay(Math.max(this.clock(), high ?? 0));
      const book = (await req(tx.objectStore("ledger").get(d))) as LedgerDay | undefined;
      const metrics: Record<string, MetricBudget> = {};
      let total = 0;
      for (const name of Object.keys(book?.metrics ?? {}).sort()) {
        const r = (book as LedgerDay).metrics[name] as { spent: number; reports: number };
        const cap = this.policy.metricCap(name);
        const spent = r.spent * EPSILON_UNIT;
        metrics[name] = { spent, cap, remaining: Math.max(0, cap - spent), reports: r.reports };
        total += r.spent;
      }
      const spent = total * EPSILON_UNIT;
      return { day: d, spent, cap: this.policy.totalDaily, remaining: Math.max(0, this.policy.totalDaily - spent), metrics };
    });
  }

  // ------------------------------------------------------------------ served definitions
  /**
   * `GET {collectorUrl}/v1/metrics` and {@link adoptServedMetrics}. A failure is counted
   * (`metrics_fetch_failed`) and leaves the definitions in effect as they are; never throws.
   */
  async refreshMetrics(): Promise<void> {
    let served: MetricSet;
    try {
      served = await fetchMetrics(this.collectorUrl, this.fetchImpl);
    } catch {
      this.count("metrics_fetch_failed");
      return;
    }
    this.adoptServedMetrics(served);
  }

  /**
   * Served definitions replace the bundled ones of the same name, each checked against the local
   * policy (refused: `metric_refused`). A served sealed or otherwise unrecordable definition stops
   * the metric here. A served definition of a metric the app's bundled document declares sealed
   * that is *not* sealed is refused (`unsealing_refused` and `metric_refused`, once per definition,
   * and logged): the collector must not turn a sealed metric into a plain one (docs/SEALED.md).
   */
  adoptServedMetrics(served: MetricSet): void {
    this.sealPin.adopt(served);
    for (const [name, why] of served.unsupported) {
      this.metricDefs.delete(name);
      this.refused.set(name, why);
    }
    for (const [name, m] of served.metrics) {
      const key = `${name}\u0000${canonicalJson({ domain: m.domain.toDict(), mechanism: m.spec.toDict() })}`;
      const why = this.servedRefusal(m);
      if (why === null) {
        this.metricDefs.set(name, m);
        this.refused.delete(name);
        continue;
      }
      this.metricDefs.delete(name);
      this.refused.set(name, why);
      if (this.refusedServed.has(key)) continue;
      this.refusedServed.add(key);
      this.count("metric_refused");
      if (this.sealPin.unsealingRefusal(m) !== null) {
        this.count("unsealing_refused");
        console.warn(`ldp-telemetry: refused a served definition of metric ${JSON.stringify(name)}: ${why}`);
      }
    }
  }

  private servedRefusal(m: MetricDefinition): string | null {
    const unsealing = this.sealPin.unsealingRefusal(m);
    if (unsealing !== null) return unsealing;
    try {
      this.policy.checkMetric(m);
      return null;
    } catch (e) {
      return (e as Error).message;
    }
  }

  /** Error counts (every name in ERROR_TALLIES, 0 when none). */
  errors(): Record<string, number> {
    return Object.fromEntries(ERROR_TALLIES.map((n) => [n, this.tally[n] ?? 0]));
  }

  /** Counts of what happened (every name in STAT_TALLIES). */
  stats(): Record<string, number> {
    return Object.fromEntries(STAT_TALLIES.map((n) => [n, this.tally[n] ?? 0]));
  }

  /** The metrics this client records. */
  get metrics(): ReadonlyMap<string, MetricDefinition> {
    return this.metricDefs;
  }

  /** Metrics in the document that this client does not record, with the reason. */
  get refusedMetrics(): ReadonlyMap<string, string> {
    return this.refused;
  }
}
