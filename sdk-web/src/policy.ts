/**
 * The device's local privacy policy: daily ε caps the device, not the server, controls
 * (client_sdk/policy.py). Amounts are integers in units of 1e-9 ε, spends rounded up and caps
 * down, so sums and comparisons are exact.
 */
import { BudgetError } from "./errors.js";
import type { MetricDefinition } from "./metrics.js";
import { RapporSpec } from "./mechanisms/rappor.js";
import { LolohaSpec } from "./mechanisms/loloha.js";
import { DBitFlipSpec, OneBitMeanSpec } from "./mechanisms/repeated.js";

export const EPSILON_UNIT = 1e-9;
export const SHIPPED_MAX_IRR_EPSILON = 2.5;
export const SHIPPED_MAX_RAPPOR_BITS = 1024;
export const SHIPPED_MAX_RAPPOR_COHORTS = 128;
/** Bounds on the repeated-collection mechanisms, fixed in the SDK as in client_sdk/policy.py: each distinct
 * rounded, bucketed or hashed value a device uses reveals one memoized response. */
export const MAX_1BITMEAN_GRANULARITY = 64;
export const MAX_DBITFLIP_SAMPLE = 32;
export const MAX_DBITFLIP_BUCKETS = 1024;
export const MAX_LOLOHA_G = 64;

/** ε in integer units of 1e-9, rounded up (spends) or down (caps); float noise such as 0.1/1e-9 absorbed. */
export function toUnits(epsilon: number, roundUp: boolean): number {
  const scaled = epsilon / EPSILON_UNIT;
  const nearest = Math.round(scaled);
  if (Math.abs(scaled - nearest) < 1e-6) return nearest;
  return roundUp ? Math.ceil(scaled) : Math.floor(scaled);
}

function cap(name: string, v: unknown): number {
  if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) throw new BudgetError(`local policy: ${name} must be a finite number > 0, got ${JSON.stringify(v)}`);
  return v;
}

export interface LocalPolicyOptions {
  perMetricDaily: number;
  totalDaily: number;
  perMetricOverrides?: Record<string, number>;
  maxIrrEpsilon?: number;
  maxRapporBits?: number;
  maxRapporCohorts?: number;
}

export class LocalPolicy {
  readonly perMetricDaily: number;
  readonly totalDaily: number;
  readonly perMetricOverrides: Readonly<Record<string, number>>;
  readonly maxIrrEpsilon: number;
  readonly maxRapporBits: number;
  readonly maxRapporCohorts: number;

  constructor(o: LocalPolicyOptions) {
    this.perMetricDaily = cap("perMetricDaily", o.perMetricDaily);
    this.totalDaily = cap("totalDaily", o.totalDaily);
    const ov: Record<string, number> = {};
    for (const [k, v] of Object.entries(o.perMetricOverrides ?? {})) ov[k] = cap(`perMetricOverrides[${k}]`, v);
    this.perMetricOverrides = Object.freeze(ov);
    const bound = (name: string, v: number, shipped: number, integer: boolean): number => {
      if (typeof v !== "number" || !(v > 0 && v <= shipped) || (integer && !Number.isInteger(v))) {
        throw new BudgetError(`local policy: ${name} must be above 0 and at most ${shipped}, the bound this SDK ships with (a device may be stricter, never laxer), got ${v}`);
      }
      return v;
    };
    this.maxIrrEpsilon = bound("maxIrrEpsilon", o.maxIrrEpsilon ?? SHIPPED_MAX_IRR_EPSILON, SHIPPED_MAX_IRR_EPSILON, false);
    this.maxRapporBits = bound("maxRapporBits", o.maxRapporBits ?? SHIPPED_MAX_RAPPOR_BITS, SHIPPED_MAX_RAPPOR_BITS, true);
    this.maxRapporCohorts = bound("maxRapporCohorts", o.maxRapporCohorts ?? SHIPPED_MAX_RAPPOR_COHORTS, SHIPPED_MAX_RAPPOR_COHORTS, true);
    Object.freeze(this);
  }

  /** The daily ε cap of `metric` (never above the total cap). */
  metricCap(metric: string): number {
    return Math.min(this.perMetricOverrides[metric] ?? this.perMetricDaily, this.totalDaily);
  }
  metricCapUnits(metric: string): number {
    return toUnits(this.metricCap(metric), false);
  }
  get totalCapUnits(): number {
    return toUnits(this.totalDaily, false);
  }

  /** Throw BudgetError if `metric`'s daily demand r·ε exceeds a cap, or a RAPPOR definition would fingerprint the device. */
  checkMetric(metric: MetricDefinition): void {
    const spec = metric.spec;
    if (spec.memoized && !(spec instanceof RapporSpec)) {
      const problems: string[] = [];
      if (spec instanceof OneBitMeanSpec && spec.granularity > MAX_1BITMEAN_GRANULARITY) {
        problems.push(`granularity ${spec.granularity} is above ${MAX_1BITMEAN_GRANULARITY} (a device may use granularity + 1 memoized bits, each costing epsilon)`);
      } else if (spec instanceof DBitFlipSpec) {
        if (spec.d > MAX_DBITFLIP_SAMPLE) problems.push(`sample ${spec.d} is above ${MAX_DBITFLIP_SAMPLE} buckets per device`);
        if (spec.k > MAX_DBITFLIP_BUCKETS) problems.push(`buckets ${spec.k} is above ${MAX_DBITFLIP_BUCKETS}`);
      } else if (spec instanceof LolohaSpec) {
        if (spec.g > MAX_LOLOHA_G) problems.push(`g ${spec.g} is above ${MAX_LOLOHA_G} (the lifetime loss is up to g * epsilon = ${spec.g * spec.epsilon})`);
        if (!(Number.isFinite(spec.irrEpsilon) && spec.epsilonOne < spec.epsilon)) problems.push("it has no instantaneous randomization (epsilon_one must be below epsilon)");
      } else if (!(spec instanceof OneBitMeanSpec)) {
        problems.push(`this device bounds memoized RAPPOR, 1bitmean, dbitflip and loloha definitions only, not ${spec.name}`);
      }
      if (problems.length) throw new BudgetError(`metric ${JSON.stringify(metric.name)} asks more than this device allows: ${problems.join("; ")}`);
    }
    if (spec instanceof RapporSpec) {
      const problems: string[] = [];
      if (spec.irrEpsilon > this.maxIrrEpsilon) problems.push(`its instantaneous randomization (p=${spec.p}, q=${spec.q}) has a per-bit epsilon of ${spec.irrEpsilon}, above ${this.maxIrrEpsilon}`);
      if (spec.numBits > this.maxRapporBits) problems.push(`num_bits ${spec.numBits} is above ${this.maxRapporBits}`);
      if (spec.numCohorts > this.maxRapporCohorts) problems.push(`num_cohorts ${spec.numCohorts} is above ${this.maxRapporCohorts}`);
      if (problems.length) throw new BudgetError(`metric ${JSON.stringify(metric.name)} would make this device's reports identify it: ${problems.join("; ")}`);
    }
    const c = this.metricCap(metric.name);
    const demand = metric.maxReportsPerDay * spec.epsilon;
    if (toUnits(demand, true) > toUnits(c, false)) {
      throw new BudgetError(`metric ${JSON.stringify(metric.name)} asks for up to ${metric.maxReportsPerDay} report(s) of epsilon ${spec.epsilon} per day (${demand} in all), above this device's daily cap of ${c} for it`);
    }
  }
}
