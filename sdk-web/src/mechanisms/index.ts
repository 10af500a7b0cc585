/** Every mechanism by registry name (an explicit table, as ldp_core.mechanisms.MECHANISMS). */
import { SpecError } from "../errors.js";
import { MechanismSpec, ReportSpec } from "./base.js";
import { CMSSpec, HCMSSpec } from "./cms.js";
import { GRRSpec } from "./grr.js";
import { PEMSpec, SFPSpec } from "./heavyhitters.js";
import { HRSpec } from "./hr.js";
import { LolohaSpec } from "./loloha.js";
import { DuchiSpec, HybridSpec, PiecewiseSpec } from "./numeric.js";
import { OLHSpec } from "./olh.js";
import { OUESpec } from "./oue.js";
import { RapporSpec } from "./rappor.js";
import { DBitFlipSpec, OneBitMeanSpec } from "./repeated.js";
import { BinaryRRSpec } from "./rr.js";
import { SquareWaveSpec } from "./squarewave.js";

export { ReportSpec, MechanismSpec, BinaryRRSpec, GRRSpec, OUESpec, RapporSpec, OLHSpec, CMSSpec, HCMSSpec, HRSpec };
export { DuchiSpec, PiecewiseSpec, HybridSpec, SquareWaveSpec, OneBitMeanSpec, DBitFlipSpec, LolohaSpec, PEMSpec, SFPSpec };

type Ctor = new (params: never) => ReportSpec;

/** name -> [spec class, its parameter names after epsilon (and domain_size for frequency oracles)] */
export const MECHANISMS: Readonly<Record<string, readonly [Ctor, readonly string[]]>> = {
  rr: [BinaryRRSpec, []],
  grr: [GRRSpec, []],
  oue: [OUESpec, []],
  rappor: [RapporSpec, ["num_bits", "num_hashes", "num_cohorts", "p", "q", "hash_seed"]],
  olh: [OLHSpec, ["g"]],
  cms: [CMSSpec, ["num_hashes", "width", "hash_seed"]],
  hcms: [HCMSSpec, ["num_hashes", "width", "hash_seed"]],
  hr: [HRSpec, ["variant"]],
  // numeric: means and distributions of bounded numbers (docs/NUMERIC.md)
  duchi: [DuchiSpec, ["low", "high", "dims", "sample"]],
  pm: [PiecewiseSpec, ["low", "high", "dims", "sample"]],
  hm: [HybridSpec, ["low", "high", "dims", "sample"]],
  sw: [SquareWaveSpec, ["low", "high", "bins", "out_bins"]],
  // repeated collection, memoized (docs/NUMERIC.md, "Repeated collection")
  "1bitmean": [OneBitMeanSpec, ["low", "high", "granularity"]],
  dbitflip: [DBitFlipSpec, ["low", "high", "buckets", "sample"]],
  loloha: [LolohaSpec, ["epsilon_one", "g"]],
  // heavy hitters (docs/HEAVY_HITTERS.md)
  pem: [PEMSpec, ["length", "start_bits", "step_bits", "g", "overflow", "oracle", "num_hashes", "width", "hash_seed", "end_marker"]],
  sfp: [SFPSpec, ["length", "sketch", "num_hashes", "width", "hash_bits", "word_share", "overflow", "end_marker"]],
};

/** The frequency oracles (the Python SDK's FREQUENCY_MECHANISMS): their specs are MechanismSpecs over domain indices. */
export const FREQUENCY_MECHANISMS = ["rr", "grr", "oue", "rappor", "olh", "cms", "hcms", "hr", "loloha"];
/** Names that need no domain_size: the numeric and heavy-hitter mechanisms (and rr, whose domain is 2). */
const NO_DOMAIN_SIZE = new Set(["rr", "duchi", "pm", "hm", "sw", "1bitmean", "dbitflip", "pem", "sfp"]);

/** Build the spec `name` from its parameters (`epsilon`, `domain_size`, ...), as Python's `make_spec`. */
export function makeSpec(name: string, params: Record<string, unknown>): ReportSpec {
  const entry = MECHANISMS[name];
  if (!entry) throw new SpecError(`unknown mechanism ${JSON.stringify(name)}; choose one of ${Object.keys(MECHANISMS).sort().join(", ")}`);
  const [ctor, own] = entry;
  const frequency = FREQUENCY_MECHANISMS.includes(name);
  const allowed = new Set(["epsilon", ...(frequency ? ["domain_size"] : []), ...own]);
  const unknown = Object.keys(params).filter((k) => !allowed.has(k));
  if (unknown.length) throw new SpecError(`${name}: unexpected parameter(s) ${unknown.join(", ")}; the parameters are ${[...allowed].join(", ")}`);
  if (!("epsilon" in params)) throw new SpecError(`${name}: missing parameter epsilon`);
  if (!NO_DOMAIN_SIZE.has(name) && !("domain_size" in params)) throw new SpecError(`${name}: missing parameter domain_size`);
  if (["duchi", "pm", "hm", "sw", "1bitmean", "dbitflip"].includes(name)) {
    for (const f of ["low", "high"]) if (!(f in params)) throw new SpecError(`${name}: missing parameter ${f}`);
  }
  return new ctor(params as never);
}

/** Inverse of `spec.toDict()`. */
export function specFromDict(data: unknown): ReportSpec {
  if (data === null || typeof data !== "object" || Array.isArray(data) || !("mechanism" in data)) {
    throw new SpecError(`a spec must be an object with a 'mechanism' key, got ${JSON.stringify(data)}`);
  }
  const { mechanism, ...params } = data as Record<string, unknown>;
  return makeSpec(String(mechanism), params);
}

/** `makeSpec` of a frequency oracle (a MechanismSpec over domain indices), or SpecError. */
export function makeFrequencySpec(name: string, params: Record<string, unknown>): MechanismSpec {
  const spec = makeSpec(name, params);
  if (!(spec instanceof MechanismSpec)) throw new SpecError(`${name} estimates a ${spec.kind}, not frequencies: this needs a frequency oracle`);
  return spec;
}
