/**
 * One report from what a metric's domain prepared, for every kind, as client_sdk's `_encode`:
 * frequency oracles privatize a domain index (RAPPOR and LOLOHA through their memoized encoders);
 * numeric mechanisms a number (1BitMean and dBitFlip memoized); heavy-hitter ones padded bytes (a
 * PEM device at its level for good, from the device secret).
 */
import { SpecError } from "./errors.js";
import { MechanismSpec, type ReportSpec } from "./mechanisms/base.js";
import { PEMSpec, SFPSpec } from "./mechanisms/heavyhitters.js";
import { LolohaSpec } from "./mechanisms/loloha.js";
import { NumericSpec } from "./mechanisms/numeric.js";
import { RapporSpec } from "./mechanisms/rappor.js";
import { DBitFlipSpec, OneBitMeanSpec } from "./mechanisms/repeated.js";
import type { RandomSource } from "./random.js";
import type { DomainInput } from "./valuedomains.js";

export interface EncodeContext {
  rng: RandomSource;
  /** The 32-byte device secret (PEM's level). */
  deviceSecret: Uint8Array;
  /** The per-metric key of memoized encoders (keyed BLAKE2b of the device secret, metric and spec). */
  metricKey: () => Uint8Array;
}

/** Privatize `input` (a domain's `indexOf`) under `spec` into one record's bytes. */
export function encodeReport(spec: ReportSpec, input: DomainInput, ctx: EncodeContext): Uint8Array {
  if (spec instanceof MechanismSpec) {
    if (spec instanceof RapporSpec) return spec.encodeMemoized(input as number, ctx.metricKey(), ctx.rng);
    if (spec instanceof LolohaSpec) return spec.encodeMemoized(input as number, ctx.metricKey(), ctx.rng);
    return spec.encodeOne(input as number, ctx.rng);
  }
  if (spec instanceof OneBitMeanSpec || spec instanceof DBitFlipSpec) return spec.encodeMemoized(input as number, ctx.metricKey(), ctx.rng);
  if (spec instanceof NumericSpec) return spec.encodeNumber(input as number | number[], ctx.rng);
  if (spec instanceof PEMSpec) return spec.encodePadded(input as Uint8Array, ctx.rng, spec.levelForDevice(ctx.deviceSecret));
  if (spec instanceof SFPSpec) return spec.encodePadded(input as Uint8Array, ctx.rng);
  throw new SpecError(`the web SDK has no encoder for ${spec.name}`);
}
