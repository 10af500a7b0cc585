/**
 * The SDK's IndexedDB database: ledger, outbox, formed batches, pins, tallies and the device secret.
 *
 * Atomicity across tabs. Every decision that must not race (a spend against the daily caps
 * together with the report it pays for, forming a batch) is one `readwrite` transaction over the
 * stores it reads and writes. IndexedDB runs readwrite transactions whose scopes overlap one at a
 * time, across every connection of the origin (IndexedDB 3.0, "transaction scheduling"), so two
 * tabs can never both read a ledger row and both spend from it. The client also serializes its
 * own persisting and uploading under Web Locks (one upload loop per origin at a time); the locks
 * keep tabs from duplicating work, the transactions keep the caps.
 *
 * Inside a transaction only IndexedDB requests are awaited (the transaction commits when it has no
 * pending request at the end of a task), so encoding is synchronous.
 */

/** 2: the `tokens` store (anonymous upload tokens, src/wallet.ts); a version-1 database is upgraded in place. */
export const DB_VERSION = 2;
export const STORES = ["meta", "ledger", "outbox", "batches", "tokens"] as const;
export type StoreName = (typeof STORES)[number];

export function openDatabase(factory: IDBFactory, name: string): Promise<IDBDatabase> {
  return new Promise((resolve, reject) => {
    const req = factory.open(name, DB_VERSION);
    req.onupgradeneeded = () => {
      const db = req.result;
      if (!db.objectStoreNames.contains("meta")) db.createObjectStore("meta");
      if (!db.objectStoreNames.contains("ledger")) db.createObjectStore("ledger", { keyPath: "day" });
      if (!db.objectStoreNames.contains("outbox")) db.createObjectStore("outbox", { autoIncrement: true });
      if (!db.objectStoreNames.contains("batches")) db.createObjectStore("batches", { keyPath: "id" });
      if (!db.objectStoreNames.contains("tokens")) db.createObjectStore("tokens", { keyPath: "id" });
    };
    req.onsuccess = () => {
      // A newer SDK in another tab wants to upgrade the database: let it (this tab's later operations fail
      // and are counted `storage_error`; a reload picks up the new SDK).
      req.result.onversionchange = () => req.result.close();
      resolve(req.result);
    };
    req.onerror = () => reject(req.error ?? new Error(`cannot open IndexedDB database ${name}`));
    // An open tab of an older SDK (version 1 had no versionchange handler) holds the database: the upgrade
    // waits until that tab closes; record() keeps queueing in memory meanwhile.
    req.onblocked = () => undefined;
  });
}

/** A request's result as a promise (await it only inside the transaction's own chain). */
export function req<T>(r: IDBRequest<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    r.onsuccess = () => resolve(r.result);
    r.onerror = () => reject(r.error ?? new Error("IndexedDB request failed"));
  });
}

/**
 * Run `body` in one transaction and resolve with its result once the transaction has committed;
 * reject (and abort) if the body throws or the transaction fails.
 */
export function transaction<T>(db: IDBDatabase, stores: readonly StoreName[], mode: IDBTransactionMode, body: (tx: IDBTransaction) => Promise<T>): Promise<T> {
  return new Promise((resolve, reject) => {
    let result: T;
    let failed: unknown = null;
    const tx = db.transaction(stores as string[], mode);
    tx.oncomplete = () => (failed === null ? resolve(result) : reject(failed));
    tx.onabort = () => reject(failed ?? tx.error ?? new Error("IndexedDB transaction aborted"));
    tx.onerror = () => undefined;
    body(tx).then(
      (r) => {
        result = r;
      },
      (e: unknown) => {
        failed = e;
        try {
          tx.abort();
        } catch {
          reject(e);
        }
      },
    );
  });
}

/** One UTC day's spending: per metric, ε spent in units of 1e-9 and reports sent. */
export interface LedgerDay {
  day: number;
  metrics: Record<string, { spent: number; reports: number }>;
}

export interface OutboxRow {
  metric: string;
  specId: string;
  spec: Record<string, unknown>;
  day: number;
  record: Uint8Array;
  enqueued: number;
}

export interface BatchRow {
  id: string;
  metric: string;
  n: number;
  bytes: number;
  frame: Uint8Array;
  attempts: number;
  nextAt: number;
  created: number;
  /** The batch's day (days since 1970, UTC): the day its token must be for (docs/TOKENS.md). Absent in rows of SDK 0.1. */
  day?: number;
  /** Its records are sealed to the analyzer's key. */
  sealed?: boolean;
}

/** One anonymous upload token (src/wallet.ts): it pays for one batch of its key's day. */
export interface TokenRow {
  /** SHA-256 of the token, hex. */
  id: string;
  token: Uint8Array;
  /** The day of its key (days since 1970, UTC): the day of the batches it can pay for. */
  day: number;
  /** The batch it is bound to (kept for that batch's retries), or null while free. */
  batchId: string | null;
  fetched: number;
}
