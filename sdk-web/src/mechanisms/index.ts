/** The frequency oracles by registry name (an explicit table, as ldp_core.mechanisms.MECHANISMS). */
import { SpecError } from "../errors.js";
import { MechanismSpec } from "./base.js";
import { CMSSpec, HCMSSpec } from "./cms.js";
import { GRRSpec } from "./grr.js";
import { HRSpec } from "./hr.js";
import { OLHSpec } from "./olh.js";
import { OUESpec } from "./oue.js";
import { RapporSpec } from "./rappor.js";
import { BinaryRRSpec } from "./rr.js";

export { MechanismSpec, BinaryRRSpec, GRRSpec, OUESpec, RapporSpec, OLHSpec, CMSSpec, HCMSSpec, HRSpec };

type Ctor = new (params: never) => MechanismSpec;

/** name -> [spec class, its parameter names after epsilon and domain_size] */
export const MECHANISMS: Readonly<Record<string, readonly [Ctor, readonly string[]]>> = {
  rr: [BinaryRRSpec, []],
  grr: [GRRSpec, []],
  oue: [OUESpec, []],
  rappor: [RapporSpec, ["num_bits", "num_hashes", "num_cohorts", "p", "q", "hash_seed"]],
  olh: [OLHSpec, ["g"]],
  cms: [CMSSpec, ["num_hashes", "width", "hash_seed"]],
  hcms: [HCMSSpec, ["num_hashes", "width", "hash_seed"]],
  hr: [HRSpec, ["variant"]],
};

/** The frequency oracles this SDK implements (the Python SDK's FREQUENCY_MECHANISMS less loloha). */
export const FREQUENCY_MECHANISMS = Object.keys(MECHANISMS);

/** Build the spec `name` from its parameters (`epsilon`, `domain_size`, ...), as Python's `make_spec`. */
export function makeSpec(name: string, params: Record<string, unknown>): MechanismSpec {
  const entry = MECHANISMS[name];
  if (!entry) throw new SpecError(`unknown mechanism ${JSON.stringify(name)}; choose one of ${Object.keys(MECHANISMS).sort().join(", ")}`);
  const [ctor, own] = entry;
  const allowed = new Set(["epsilon", "domain_size", ...own]);
  const unknown = Object.keys(params).filter((k) => !allowed.has(k));
  if (unknown.length) throw new SpecError(`${name}: unexpected parameter(s) ${unknown.join(", ")}; the parameters are ${[...allowed].join(", ")}`);
  if (!("epsilon" in params)) throw new SpecError(`${name}: missing parameter epsilon`);
  if (name !== "rr" && !("domain_size" in params)) throw new SpecError(`${name}: missing parameter domain_size`);
  return new ctor(params as never);
}

/** Inverse of `spec.toDict()`. */
export function specFromDict(data: unknown): MechanismSpec {
  if (data === null || typeof data !== "object" || Array.isArray(data) || !("mechanism" in data)) {
    throw new SpecError(`a spec must be an object with a 'mechanism' key, got ${JSON.stringify(data)}`);
  }
  const { mechanism, ...params } = data as Record<string, unknown>;
  return makeSpec(String(mechanism), params);
}
