/**
 * Declarative metric definitions: the metrics file, or the collector's `GET /v1/metrics`
 * (the same document), validated as ldp_core/metrics.py does.
 *
 * Every kind the Python SDK records is recordable here: frequency oracles, means (duchi, pm, hm,
 * "auto", 1bitmean), distributions (sw, dbitflip) and heavy hitters (pem, sfp), sealed or not (a sealed
 * metric's records are sealed at upload, src/sealing.ts). A valid metric this SDK still cannot record
 * (a mechanism newer than this SDK) is refused *per metric*: listed in {@link MetricSet.unsupported}
 * with a message that names it, its kind and what to do; recording it counts `unknown_metric`. An
 * invalid definition is an error, as in Python.
 */
import { MetricsFileError, SpecError } from "./errors.js";
import { domainFromDict, type Domain } from "./domain.js";
import { MECHANISMS, specFromDict, type ReportSpec } from "./mechanisms/index.js";
import { bestMeanMechanism } from "./mechanisms/numeric.js";
import { NumberRange, StringDomain } from "./valuedomains.js";
import { AnalyzerPublicKey, parseAnalyzerKeys } from "./sealing.js";

export const FORMAT = "ldp-metrics/1";
export const MAX_REPORTS_PER_DAY = 10_000;
const NAME_RE = /^[A-Za-z0-9_.:-]{1,255}$/;
const FIELDS = ["description", "owner", "expires", "mechanism", "domain", "max_reports_per_day"];
const OPTIONAL = ["kind", "sealed"];
/** What a metric may estimate (ldp_core/metrics.py KINDS). */
const KINDS = ["frequency", "mean", "distribution", "heavy_hitters"];

/** Days since 1970-01-01 of a time in milliseconds, in UTC. */
export function utcDay(ms: number): number {
  return Math.floor(ms / 86_400_000);
}

export interface MetricDefinition {
  readonly name: string;
  readonly spec: ReportSpec;
  readonly domain: Domain;
  /** What the metric estimates: its mechanism's kind ("frequency", "mean", "distribution", "heavy_hitters"). */
  readonly kind: string;
  readonly owner: string;
  readonly description: string;
  /** The last UTC day (days since 1970-01-01) on which the metric may be recorded. */
  readonly expiresDay: number;
  readonly maxReportsPerDay: number;
  /** `"sealed": true`: each record is sealed to the analyzer's key before it leaves the device (docs/SEALED.md). */
  readonly sealed?: boolean;
}

export interface MetricSet {
  readonly metrics: ReadonlyMap<string, MetricDefinition>;
  /** Valid metrics this SDK cannot record (a mechanism newer than it), with the reason. */
  readonly unsupported: ReadonlyMap<string, string>;
  /** The metrics the document declares `"sealed": true`. */
  readonly sealed?: ReadonlySet<string>;
  /** The document's `analyzer_keys`, the current key first (sealed metrics are sealed to it). */
  readonly analyzerKeys?: readonly AnalyzerPublicKey[];
}

function isoDay(s: unknown): number | null {
  if (typeof s !== "string") return null;
  const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(s);
  if (!m) return null;
  const [y, mo, d] = [Number(m[1]), Number(m[2]), Number(m[3])];
  const t = Date.UTC(y, mo - 1, d);
  const back = new Date(t);
  if (back.getUTCFullYear() !== y || back.getUTCMonth() !== mo - 1 || back.getUTCDate() !== d) return null;
  return utcDay(t);
}

function parseOne(name: string, data: unknown): MetricDefinition | string {
  const where = `metric ${JSON.stringify(name)}`;
  if (!NAME_RE.test(name)) throw new MetricsFileError(`metric name ${JSON.stringify(name)} is invalid: use 1-255 characters from letters, digits and _ . : -`);
  if (data === null || typeof data !== "object" || Array.isArray(data)) throw new MetricsFileError(`${where}: the definition must be an object with ${FIELDS.join(", ")}`);
  const o = data as Record<string, unknown>;
  if (o.kind === "prio3") {
    // secret-shared for two aggregators (docs/PRIO3.md): the Python SDK (client_sdk.prio3) records these. The web
    // SDK cannot yet: the aggregators run VDAF draft 18 (the prio crate 0.18.1) and the only maintained TypeScript
    // Prio3, @divviup/prio3 0.8.0, implements draft 08, whose reports they would reject (docs/PRIO3.md, "The web SDK").
    return `metric ${JSON.stringify(name)} is a prio3 metric (secret shares for two aggregators), which the web SDK does not record yet: no TypeScript Prio3 of VDAF draft 18 exists (the rest of the file is recorded); record it from the Python SDK's Prio3Client`;
  }
  const unknown = Object.keys(o).filter((k) => !FIELDS.includes(k) && !OPTIONAL.includes(k)).sort();
  if (unknown.length) throw new MetricsFileError(`${where}: unknown field(s) ${unknown.join(", ")}; the fields are ${FIELDS.join(", ")} and optionally ${OPTIONAL.join(", ")}`);
  const missing = FIELDS.filter((f) => !(f in o));
  if (missing.length) throw new MetricsFileError(`${where}: missing field(s) ${missing.join(", ")}`);
  const expiresDay = isoDay(o.expires);
  if (expiresDay === null) throw new MetricsFileError(`${where}: 'expires' must be an ISO date such as "2027-12-31", got ${JSON.stringify(o.expires)}`);
  for (const f of ["owner", "description"]) {
    if (typeof o[f] !== "string" || !(o[f] as string).trim()) throw new MetricsFileError(`${where}: '${f}' must be a non-empty string`);
  }
  const r = o.max_reports_per_day;
  if (typeof r !== "number" || !Number.isInteger(r) || r < 1 || r > MAX_REPORTS_PER_DAY) {
    throw new MetricsFileError(`${where}: 'max_reports_per_day' must be an integer from 1 to ${MAX_REPORTS_PER_DAY}, got ${JSON.stringify(r)}`);
  }
  if (o.sealed !== undefined && typeof o.sealed !== "boolean") throw new MetricsFileError(`${where}: 'sealed' must be true or false`);
  const kind = o.kind;
  if (kind !== undefined && !KINDS.includes(kind as string)) throw new MetricsFileError(`${where}: 'kind' must be one of ${KINDS.join(", ")}, got ${JSON.stringify(kind)}`);
  const mech0 = o.mechanism;
  if (mech0 === null || typeof mech0 !== "object" || Array.isArray(mech0)) throw new MetricsFileError(`${where}: 'mechanism' must be an object such as {"mechanism": "grr", "epsilon": 1.0}`);
  const mech: Record<string, unknown> = { ...(mech0 as Record<string, unknown>) };
  const mechName = mech.mechanism;
  const stated = `a ${String(kind ?? "frequency")} metric (mechanism ${JSON.stringify(mechName)})`;
  if (typeof mechName !== "string" || (mechName !== "auto" && !(mechName in MECHANISMS))) {
    return `metric ${JSON.stringify(name)} is ${stated} that this version of the web SDK does not know, so it is not recorded here (the rest of the file is); update @ldp-telemetry/web, or record it from the Python SDK`;
  }
  let domain: Domain;
  try {
    domain = domainFromDict(o.domain);
  } catch (e) {
    throw new MetricsFileError(`${where}: bad 'domain': ${(e as Error).message}`);
  }
  let spec: ReportSpec;
  try {
    const cls = mechName === "auto" ? null : specFromDictKind(mechName);
    if (domain instanceof StringDomain) {
      if (cls !== "heavy_hitters") throw new SpecError(`a 'string' domain needs a heavy-hitter mechanism (pem or sfp), got ${JSON.stringify(mechName)}`);
      mech.length ??= domain.length;
      mech.overflow ??= domain.overflow;
      if (domain.endMarker === 1) mech.end_marker ??= 1;
    } else if (domain instanceof NumberRange) {
      if (cls === "frequency") throw new SpecError(`a frequency mechanism (${mechName}) needs a 'dictionary' or 'hashed' domain, not a range`);
      mech.low ??= domain.low;
      mech.high ??= domain.high;
      if (mechName === "auto") {
        if (kind !== undefined && kind !== "mean") throw new SpecError(`'auto' picks a mean mechanism, but the metric's kind is ${JSON.stringify(kind)}`);
        if (typeof mech.epsilon !== "number") throw new SpecError(`epsilon must be a number, got ${JSON.stringify(mech.epsilon)}`);
        mech.mechanism = bestMeanMechanism(mech.epsilon, (mech.dims as number | undefined) ?? 1, (mech.sample as number | null | undefined) ?? null);
      }
    } else {
      if (mechName === "auto" || cls !== "frequency") {
        const needs = mechName === "pem" || mechName === "sfp" ? "a 'string'" : "a 'range'";
        throw new SpecError(`a ${mechName === "auto" ? "numeric" : cls} mechanism (${mechName}) needs ${needs} domain`);
      }
      mech.domain_size ??= domain.size;
    }
    spec = specFromDict(mech);
  } catch (e) {
    if (e instanceof SpecError) throw new MetricsFileError(`${where}: bad 'mechanism': ${e.message}`);
    throw e;
  }
  if (domain instanceof NumberRange) {
    const dims = (spec as { dims?: number }).dims ?? 1;
    if (dims !== 1) domain = domain.withDims(dims);
  }
  if (kind !== undefined && kind !== spec.kind) throw new MetricsFileError(`${where}: 'kind' is ${JSON.stringify(kind)} but ${spec.name} estimates a ${spec.kind}`);
  if (domain instanceof StringDomain) {
    const s = spec as unknown as { length: number; overflow: string; endMarker: number };
    if (s.length !== domain.length || s.overflow !== domain.overflow || s.endMarker !== domain.endMarker) {
      throw new MetricsFileError(`${where}: the mechanism's length/overflow/end_marker (${s.length}, ${s.overflow}, ${s.endMarker}) differ from the domain's (${domain.length}, ${domain.overflow}, ${domain.endMarker}); leave them out to use the domain's`);
    }
  } else if (domain instanceof NumberRange) {
    const s = spec as unknown as { low: number; high: number };
    if (s.low !== domain.low || s.high !== domain.high) {
      throw new MetricsFileError(`${where}: the mechanism's range [${s.low}, ${s.high}] differs from the domain's [${domain.low}, ${domain.high}]; leave low and high out to use the domain's`);
    }
  } else if ((spec as { domainSize?: number }).domainSize !== domain.size) {
    throw new MetricsFileError(`${where}: the mechanism's domain_size ${(spec as { domainSize?: number }).domainSize} differs from the domain's size ${domain.size}; leave domain_size out to use the domain's`);
  }
  return { name, spec, domain, kind: spec.kind, owner: o.owner as string, description: o.description as string, expiresDay, maxReportsPerDay: r, sealed: o.sealed === true };
}

/**
 * Validate a metrics document (JSON text or a parsed object). The SDK passes `rejectExpired: false`
 * and stops recording expired metrics instead, so an app never fails to start because a date passed.
 */
export function parseMetrics(document: string | unknown, options: { today?: number; rejectExpired?: boolean } = {}): MetricSet {
  let obj: unknown = document;
  if (typeof document === "string") {
    try {
      obj = JSON.parse(document);
    } catch (e) {
      throw new MetricsFileError(`metrics file is not valid JSON: ${(e as Error).message}`);
    }
  }
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) throw new MetricsFileError('a metrics file must be a JSON object {"format": ..., "metrics": {...}}');
  const o = obj as Record<string, unknown>;
  if (o.format !== FORMAT) throw new MetricsFileError(`metrics file format must be ${JSON.stringify(FORMAT)}, got ${JSON.stringify(o.format)}`);
  // prio3_aggregators: the two Prio3 aggregators' keys (docs/PRIO3.md), used by prio3 metrics only
  const unknown = Object.keys(o).filter((k) => !["format", "metrics", "analyzer_keys", "prio3_aggregators"].includes(k));
  if (unknown.length) throw new MetricsFileError(`metrics file: unknown top-level key(s) ${unknown.sort().join(", ")}`);
  const raw = o.metrics;
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) throw new MetricsFileError("metrics file: 'metrics' must be an object keyed by metric name");
  const metrics = new Map<string, MetricDefinition>();
  const unsupported = new Map<string, string>();
  const sealed = new Set<string>();
  const today = options.today ?? utcDay(Date.now());
  for (const [name, data] of Object.entries(raw as Record<string, unknown>)) {
    const m = parseOne(name, data);
    if ((data as Record<string, unknown>).sealed === true) sealed.add(name);
    if (typeof m === "string") unsupported.set(name, m);
    else {
      if ((options.rejectExpired ?? true) && m.expiresDay < today) {
        throw new MetricsFileError(`metric ${JSON.stringify(name)} expired; its owner ${m.owner} must renew ('expires') or remove it`);
      }
      metrics.set(name, m);
    }
  }
  let analyzerKeys: AnalyzerPublicKey[];
  try {
    analyzerKeys = parseAnalyzerKeys(o.analyzer_keys);
  } catch (e) {
    throw new MetricsFileError(`metrics file: bad 'analyzer_keys': ${(e as Error).message}`);
  }
  if (sealed.size && !analyzerKeys.length) {
    throw new MetricsFileError(`metric(s) ${[...sealed].sort().join(", ")} are sealed, but the metrics file names no 'analyzer_keys'; add the analyzer's public key (\`ldp keys new --metrics FILE\`)`);
  }
  return { metrics, unsupported, sealed, analyzerKeys };
}

/** `GET {collectorUrl}/v1/metrics`, validated. */
export async function fetchMetrics(collectorUrl: string, fetchImpl: typeof fetch = globalThis.fetch): Promise<MetricSet> {
  const resp = await fetchImpl(collectorUrl.replace(/\/+$/, "") + "/v1/metrics", { headers: { Accept: "application/json" }, credentials: "omit" });
  if (resp.status !== 200) throw new MetricsFileError(`GET /v1/metrics answered ${resp.status}`);
  return parseMetrics(await resp.text(), { rejectExpired: false });
}

/** The kind of the registered mechanism `name` (without building a spec). */
function specFromDictKind(name: string): string {
  if (["duchi", "pm", "hm", "1bitmean"].includes(name)) return "mean";
  if (["sw", "dbitflip"].includes(name)) return "distribution";
  if (["pem", "sfp"].includes(name)) return "heavy_hitters";
  return "frequency";
}
