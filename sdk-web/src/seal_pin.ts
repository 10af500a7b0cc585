/**
 * What a served metrics document may not change about sealing (docs/SEALED.md, "Pinned keys and
 * sealing"), as client_sdk/seal_pin.py does for the Python SDK. The app's bundled metrics document is
 * the trust anchor:
 *
 * - records are sealed only to an analyzer key the bundled document names: the served current key if
 *   the bundle names it (so the analyzer can rotate to a key the app already ships), else the bundled
 *   current key; any other served key is refused (`analyzer_key_refused`, warned once per key);
 * - a served definition that drops sealing from a metric the bundle declares sealed is refused
 *   (`unsealing_refused` and `metric_refused`, counted by the client);
 * - a metric once sealed (bundled sealed, or sealed by a served definition since the client started) has
 *   its stored reports sealed at upload even if its definition in effect is now plain or refused.
 *
 * An app whose bundled document names no key has nothing to pin: a metric only the collector declares
 * sealed is sealed to the key the collector serves.
 */
import type { MetricDefinition, MetricSet } from "./metrics.js";
import type { AnalyzerPublicKey } from "./sealing.js";

export class SealPin {
  private readonly pinned: readonly AnalyzerPublicKey[];
  private readonly bundledSealed: ReadonlySet<string>;
  private readonly mustSeal: Set<string>;
  private readonly refusedKeys = new Set<string>();
  private current: AnalyzerPublicKey | null;

  constructor(
    bundled: MetricSet,
    private readonly count: (name: string) => void,
  ) {
    this.pinned = bundled.analyzerKeys ?? [];
    this.bundledSealed = new Set(bundled.sealed ?? []);
    this.mustSeal = new Set(this.bundledSealed);
    this.current = this.pinned[0] ?? null;
  }

  /** The bundled document's analyzer keys (the current one first). */
  get pinnedKeys(): readonly AnalyzerPublicKey[] {
    return this.pinned;
  }

  /** The key sealed records go to now. */
  get key(): AnalyzerPublicKey | null {
    return this.current;
  }

  /** Why `served` may not replace the bundled definition (it drops sealing), or null. */
  unsealingRefusal(served: MetricDefinition): string | null {
    if (!this.bundledSealed.has(served.name) || served.sealed) return null;
    return (
      `metric ${JSON.stringify(served.name)} is sealed in the app's metrics file and the served definition is not: its records would ` +
      "reach the collector in plain, so the definition is refused and the metric is not reported until a sealed definition is served again"
    );
  }

  /** Take the served document's key (if the bundle allows it) and remember its sealed metrics. */
  adopt(served: MetricSet): void {
    const offered = served.analyzerKeys?.[0] ?? null;
    let to: AnalyzerPublicKey | null;
    if (offered === null || this.pinned.some((k) => k.equals(offered))) to = offered ?? this.pinned[0] ?? null;
    else if (!this.pinned.length) to = offered;
    else {
      if (!this.refusedKeys.has(offered.keyId)) {
        this.refusedKeys.add(offered.keyId);
        this.count("analyzer_key_refused");
        console.warn(
          `ldp-telemetry: refused the analyzer key ${offered.keyId} served by the collector: the app's metrics file does not name it; ` +
            `records stay sealed to ${(this.pinned[0] as AnalyzerPublicKey).keyId} (ship a new key in the app before the analyzer rotates to it)`,
        );
      }
      to = this.pinned[0] as AnalyzerPublicKey;
    }
    if (to) this.current = to;
    for (const [name, m] of served.metrics) if (m.sealed && this.current) this.mustSeal.add(name);
  }

  /** The key the stored reports of `metric` must be sealed to, or null if it is a plain metric. */
  keyFor(metric: string): AnalyzerPublicKey | null {
    return this.mustSeal.has(metric) ? this.current : null;
  }

  /** Whether reports of `metric` may only leave sealed. */
  mustBeSealed(metric: string): boolean {
    return this.mustSeal.has(metric);
  }
}
